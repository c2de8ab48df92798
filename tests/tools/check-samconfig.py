"""Check infra/samconfig.toml against template.yaml: every team's deploy section names stack
gitstate-<team>, sets TeamName=<team>, gives every required parameter and no unknown one, and
allows the named IAM role."""

import sys
import tomllib

from samcli.cli.types import CfnParameterOverridesType
from samcli.yamlhelper import yaml_parse


def main(config_path, template_path):
    with open(template_path, encoding="utf-8") as f:
        parameters = yaml_parse(f.read())["Parameters"]
    required = {k for k, v in parameters.items() if "Default" not in v}
    with open(config_path, "rb") as f:
        config = tomllib.load(f)
    problems = []
    teams = [env for env, cmds in config.items() if isinstance(cmds, dict) and "deploy" in cmds]
    for team in teams:
        deploy = config[team]["deploy"]["parameters"]
        overrides = deploy.get("parameter_overrides", [])
        if isinstance(overrides, str):
            overrides = [overrides]
        given = CfnParameterOverridesType().convert(tuple(overrides), None, None)
        if deploy.get("stack_name") != f"gitstate-{team}":
            problems.append(f"{team}: stack_name must be gitstate-{team}")
        if given.get("TeamName") != team:
            problems.append(f"{team}: TeamName must be {team}")
        problems += [f"{team}: unknown parameter {k}" for k in sorted(set(given) - set(parameters))]
        problems += [f"{team}: missing parameter {k}" for k in sorted(required - set(given))]
        for key in ("capabilities", "region"):
            if key not in deploy:
                problems.append(f"{team}: {key} is not set")
        # The role has a fixed name (the key policy names it): CAPABILITY_IAM is refused.
        if "CAPABILITY_NAMED_IAM" not in str(deploy.get("capabilities", "")):
            problems.append(f"{team}: capabilities must include CAPABILITY_NAMED_IAM")
    if not teams:
        problems.append("no team: no [<team>.deploy.parameters] section")
    for problem in problems:
        print(f"{config_path}: {problem}", file=sys.stderr)
    print(f"{config_path}: {len(teams)} teams: {', '.join(teams)}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main(*sys.argv[1:3])
