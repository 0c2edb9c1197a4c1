"""What passing certification means, and how much is measured for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gates:
    # largest |delta logit| that passes: 0, bit-identical logits, unless set explicitly
    # (then the certificate says the split is not exact)
    tolerance: float = 0.0
    speed_fraction: float = 0.5  # route decode tokens/s over the unsplit reference's
    parity_steps: int = 8  # greedy steps compared after each prompt
    speed_tokens: int = 32  # tokens generated per speed measurement
    repeats: int = 2  # speed measurements per side; the best one counts

    def args(self) -> list[str]:
        """The same gates as `meshnet certify` options (for the certification Job)."""
        return ["--tolerance", repr(self.tolerance), "--speed-fraction", repr(self.speed_fraction),
                "--parity-steps", str(self.parity_steps), "--speed-tokens",
                str(self.speed_tokens), "--repeats", str(self.repeats)]
