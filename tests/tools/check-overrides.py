"""infra/deploy's parameter overrides survive the SAM CLI's parsing whole: generated values (spaces
as in a flattened PEM, quotes, =, commas, $, backslashes, newlines, non-ASCII) quoted by
infra/config.py and parsed back by the SAM CLI's own --parameter-overrides type give the same
parameters; the values it cannot express are refused, never cut.

    python tests/tools/check-overrides.py [--cases N] [--seed S]
"""

import argparse
import os
import random
import sys

from samcli.cli.types import CfnParameterOverridesType

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "infra"))
import config  # noqa: E402  (infra/config.py)

ALPHABET = list("abcXYZ019-_./:+") + [" ", " ", '"', "'", "=", ",", "$", "\\", "\n", "\t", "é", "€", "{", "}", "(", "*"]


def expressible(value):
    """Independently of infra/config.py: the SAM CLI reads a backslash before a quote, a space or
    a line end, or at the end, as an escape; every other value can pass."""
    return not (value.endswith("\\") or any(value[i] == "\\" and value[i + 1] in "\"' \n" for i in range(len(value) - 1)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    parse = CfnParameterOverridesType().convert
    failures, refused = [], 0
    pem = "-----BEGIN CERTIFICATE----- MIIBszCCAVmgAwIBAgIU -----END CERTIFICATE-----"
    values = [pem, "", "a b", 'say "hi"', "x=y", "a,b", "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA"]
    values += ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30))) for _ in range(args.cases)]
    for round_ in range(0, len(values), 5):
        batch = {f"P{i}": v for i, v in enumerate(values[round_:round_ + 5])}
        quoted = []
        for key, value in batch.items():
            try:
                quoted.append(config.quote(key, value))
            except config.Unquotable:
                refused += 1
                if expressible(value):
                    failures.append(f"{value!r} refused but expressible")
                continue
            if not expressible(value):
                failures.append(f"{value!r} quoted but the SAM CLI cannot read it back")
                continue
            try:
                alone = parse((quoted[-1],), None, None)
            except Exception as error:  # noqa: BLE001  (click's BadParameter)
                alone = error
            if alone != {key: value}:
                failures.append(f"{value!r} -> {quoted[-1]!r} -> {alone!r}")
        # Several overrides, one argument each, as infra/deploy passes them.
        want = {k: v for k, v in batch.items() if expressible(v)}
        try:
            got = parse(tuple(quoted), None, None) if quoted else {}
        except Exception as error:  # noqa: BLE001
            got = error
        if got != want:
            failures.append(f"together: {quoted!r} -> {got!r}, want {want!r}")
    for failure in failures[:20]:
        print(f"check-overrides: {failure}", file=sys.stderr)
    print(f"check-overrides: {len(values)} values ({refused} refused as inexpressible), seed {args.seed}: {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
