"""Many more mutated HF config.json files than tests/test_hf_config_fuzz.py tries in CI (issue 31), each under a
5-second alarm: one key of a real config in tests/hf_configs replaced by one of a fixed set of awkward JSON values
(wrong types, 2**63, 10**4000, inf, nan, empty containers) or removed. Prints every case that ends in another
exception than gbmw's one-line error, an error without the file's name, or no answer within 5 s (a hang).

    .venv/bin/python benchmarks/hf_config_mutations.py --cases 10000 --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import tempfile
from collections import Counter
from pathlib import Path

from gbmw.errors import GbmwError
from gbmw.specs.hf_import import import_hf_config
from gbmw.specs.models import build_model

CONFIGS = sorted((Path(__file__).resolve().parent.parent / "tests" / "hf_configs").glob("*.json"))
AWKWARD = [None, True, False, 0, -1, 1, 2**31, 2**63, 2**70, -2**70, 10**4000, 0.5, 1e308, float("inf"), float("nan"),
           "auto", "", "64", [], {}, [1], {"a": 1}]
REMOVE = "(removed)"
ALARM_S = 5


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    chooser = random.Random(args.seed)
    signal.signal(signal.SIGALRM, _alarm)
    outcomes: Counter[str] = Counter()
    with tempfile.TemporaryDirectory(prefix="gbmw-hf-mutations-") as folder:
        path = Path(folder) / "config.json"
        for _ in range(args.cases):
            source = chooser.choice(CONFIGS)
            config = json.loads(source.read_text())
            key, value = chooser.choice(sorted(config)), chooser.choice(AWKWARD + [REMOVE])
            if value == REMOVE:
                del config[key]
            else:
                config[key] = value
            path.write_text(json.dumps(config))
            case = f"{source.name} {key} = {str(value)[:40]}"
            signal.alarm(ALARM_S)
            try:
                build_model(import_hf_config(path), "bf16")
                outcomes["a model"] += 1
            except GbmwError as error:
                clean = "\n" not in str(error) and str(path) in str(error)
                outcomes["one line" if clean else "a line without the file"] += 1
                if not clean:
                    print(f"line without the file: {case}: {error}")
            except Hang:
                outcomes["no answer in 5 s"] += 1
                print(f"hang: {case}")
            except Exception as error:  # noqa: BLE001 - what the benchmark looks for
                outcomes["another exception"] += 1
                print(f"{type(error).__name__}: {case}: {str(error)[:120]}")
            finally:
                signal.alarm(0)
    print(f"{args.cases} cases from {len(CONFIGS)} real configs: " + ", ".join(f"{count} {what}" for what, count in
                                                                              outcomes.most_common()))


if __name__ == "__main__":
    main()
