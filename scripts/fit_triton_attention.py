"""Regenerate simcore/data/profiles/derived/triton-attention-l40s.json (vLLM's Triton context
attention against FlashAttention 2, `simcore.calibration.triton_attention`) from the installed
aiconfigurator-core; the same package gives the same bytes.

    python scripts/fit_triton_attention.py
"""

from __future__ import annotations

import json

from simcore.calibration.triton_attention import SHIPPED, fit_triton_context_ratio


def main() -> None:
    data = fit_triton_context_ratio()
    SHIPPED.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    q = data["long_prompt_quantiles"]
    print(f"{SHIPPED.name}: {len(data['batch'])} batches x {len(data['prompt'])} prompt lengths "
          f"over {len(data['provenance']['shapes'])} head shapes; from {q['from_prompt']} "
          f"tokens: median x{q['median']}, p10 x{q['p10']}, p90 x{q['p90']} (n={q['n']})")


if __name__ == "__main__":
    main()
