"""Calibration profiles: measured per-op and collective times of one GPU, fitted into curves the
simulator looks up by shape (`profile`), read from measurement tables (`measurements`) and
fitted with held-out error statistics (`fit`)."""

from simcore.calibration.profile import (
    FORMAT, VERSION, CalibrationProfile, ProfileData, shipped_profile, shipped_profile_ids)

__all__ = ["FORMAT", "VERSION", "CalibrationProfile", "ProfileData", "shipped_profile",
           "shipped_profile_ids"]
