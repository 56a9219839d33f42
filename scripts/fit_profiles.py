"""Regenerate the shipped calibration profiles (simcore/data/profiles/*-vidur.json) from the copy
of the copy of vidur's profiling data in simcore/data/measurements/vidur; the same data gives the
same bytes.

    python scripts/fit_profiles.py [--vidur DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simcore.calibration.fit import VIDUR_PROFILES, fit_vidur_profile
from simcore.reference_data import VIDUR_DIR

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VIDUR = VIDUR_DIR
OUT = ROOT / "simcore" / "data" / "profiles"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur", type=Path, default=DEFAULT_VIDUR,
                        help="vidur data directory (holds profiling/)")
    args = parser.parse_args()
    for gpu in VIDUR_PROFILES:
        profile = fit_vidur_profile(args.vidur, gpu)
        path = OUT / f"{profile.profile_id}.json"
        profile.save(path)
        ops = profile.data.errors.ops["all"]
        print(f"{path.relative_to(ROOT)}: {path.stat().st_size // 1024} KiB, held-out median "
              f"relative error {ops.median:.1%} over {ops.n} compute rows")


if __name__ == "__main__":
    main()
