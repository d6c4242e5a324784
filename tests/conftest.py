"""The benchmarks package lives beside tcnn/, outside the installed package: tests that check it (or use its
reference GPSA as an oracle) import it from the repository root."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
