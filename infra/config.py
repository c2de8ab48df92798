"""infra/deploy's helpers: read infra/samconfig.toml, quote parameter overrides, and read what
CloudFormation says about a change set. Standard library only (python3 >= 3.11).

    config.py teams CONFIG                       the teams, one per line
    config.py region CONFIG TEAM                 the team's region
    config.py overrides CONFIG TEAM [K=V...]     the team's parameter overrides with K=V replacing
                                                 or adding keys, each a quoted Key="value" ended
                                                 by a NUL byte
    config.py param CONFIG TEAM KEY [K=V...]     one merged parameter's value (empty if unset)
    config.py changeset SINCE                    newest available change set created at or after
                                                 SINCE (ISO 8601), from list-change-sets JSON on
                                                 stdin; empty for none
    config.py replacements                       the resources a change set (describe-change-set
                                                 JSON on stdin) would replace or remove whose loss
                                                 orphans states or moves the URL, one per line
"""

import json
import sys
import tomllib
from datetime import datetime

# Replacing or removing these loses something a team depends on: the key seals every state, the
# role is what the key policy names, the function and its URL are the backend's address, the
# log group holds the history of logins.
WATCHED = {
    "StateKey": "the team key (states sealed under it stay sealed under it)",
    "StateKeyAlias": "the key's alias",
    "FunctionRole": "the function role",
    "Function": "the function (the Function URL changes)",
    "FunctionUrl": "the Function URL (every backend block must change)",
    "LogGroup": "the log group",
}


def load(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


def teams(config):
    return [env for env, cmds in config.items() if isinstance(cmds, dict) and "deploy" in cmds]


def deploy_parameters(config, team):
    return config[team]["deploy"]["parameters"]


def split_given(given):
    """samconfig's parameter_overrides: a list of Key=Value, or one string of them."""
    if isinstance(given, str):
        # The string form is split the way the SAM CLI splits it (quotes kept together).
        from shlex import split

        given = split(given)
    return given


def merged(config, team, extra):
    given = split_given(deploy_parameters(config, team).get("parameter_overrides", []))
    out = dict(item.split("=", 1) for item in given)
    for item in extra:
        key, value = item.split("=", 1)
        out[key] = value
    return out


class Unquotable(ValueError):
    pass


def quote(key, value):
    """One override as the SAM CLI parses --parameter-overrides: Key="value" with double quotes
    escaped, so spaces (a flattened PEM), quotes, commas and = survive as one value. The SAM CLI
    keeps other backslashes as they are but reads a backslash before a quote, a space or a line
    end, or at the end, as an escape: such a value cannot be passed and is refused rather than cut."""
    if value.endswith("\\") or any(f"\\{c}" in value for c in "\"' \n"):
        raise Unquotable(
            f"{key}: the SAM CLI cannot take a backslash before a quote, a space or a line end"
        )
    escaped = value.replace('"', '\\"')
    return f'{key}="{escaped}"'


def newest_change_set(listing, since):
    since = datetime.fromisoformat(since)
    ready = [
        s for s in listing.get("Summaries", [])
        if s.get("Status") == "CREATE_COMPLETE"
        and s.get("ExecutionStatus") == "AVAILABLE"
        and datetime.fromisoformat(s["CreationTime"]) >= since
    ]
    ready.sort(key=lambda s: datetime.fromisoformat(s["CreationTime"]))
    return ready[-1]["ChangeSetId"] if ready else ""


def replacements(description):
    out = []
    for change in description.get("Changes", []):
        rc = change.get("ResourceChange", {})
        logical = rc.get("LogicalResourceId")
        if logical not in WATCHED:
            continue
        action = rc.get("Action")
        if action == "Remove" or (action == "Modify" and rc.get("Replacement") in ("True", "Conditional")):
            how = "removed" if action == "Remove" else f"replaced ({rc.get('Replacement')})"
            out.append(f"{logical}: {WATCHED[logical]} would be {how}")
    return out


def main(argv):
    command, *args = argv
    if command == "teams":
        print("\n".join(teams(load(args[0]))))
    elif command == "region":
        print(deploy_parameters(load(args[0]), args[1]).get("region", ""))
    elif command == "overrides":
        # NUL-terminated: a value may hold a newline.
        config, team, *extra = args
        try:
            quoted = [quote(k, v) for k, v in merged(load(config), team, extra).items()]
        except Unquotable as refused:
            sys.exit(f"infra/deploy: {refused}")
        sys.stdout.write("".join(q + "\0" for q in quoted))
    elif command == "param":
        config, team, key, *extra = args
        print(merged(load(config), team, extra).get(key, ""))
    elif command == "changeset":
        print(newest_change_set(json.load(sys.stdin), args[0]))
    elif command == "replacements":
        lines = replacements(json.load(sys.stdin))
        if lines:
            print("\n".join(lines))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main(sys.argv[1:])
