"""Packet-level fabric backend: store-and-forward links, ECN/drop-tail/lossless egress queues,
switches with ECMP or adaptive routing and PFC, credit-based links, and NICs with pacing,
go-back-N and DCQCN, run by a compiled event loop (numba)."""

from simcore.fabric.packet.fabric import PacketFabric
from simcore.fabric.packet.profiles import PacketSettings, infiniband, roce_v2, slingshot

__all__ = ["PacketFabric", "PacketSettings", "infiniband", "roce_v2", "slingshot"]
