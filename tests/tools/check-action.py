"""Checks infra/action/action.yml against itself and against the workflows that use it.

actionlint reads workflows only, so this covers the action's metadata: every `inputs.X` its steps
read is declared, every declared output comes from a step that writes it, and every workflow step
`uses: ./infra/action` passes only declared inputs and reads only declared outputs.
Usage: python tests/tools/check-action.py infra/action/action.yml .github/workflows/*.yml
"""

import re
import sys

import yaml


def main(action_path, workflow_paths):
    problems = []
    action = yaml.safe_load(open(action_path))
    inputs = set(action.get("inputs", {}))
    outputs = action.get("outputs", {})
    runs = action["runs"]
    if runs.get("using") != "composite":
        problems.append(f"{action_path}: expected a composite action")
    steps = {step.get("id"): step for step in runs.get("steps", [])}
    text = yaml.safe_dump(runs)
    for name in re.findall(r"inputs\.([A-Za-z0-9_-]+)", text):
        if name not in inputs:
            problems.append(f"{action_path}: a step reads inputs.{name}, which is not declared")
    for name in inputs:
        if f"inputs.{name}" not in text:
            problems.append(f"{action_path}: input {name} is declared but never read")
    for name, output in outputs.items():
        match = re.fullmatch(r"\$\{\{ steps\.([A-Za-z0-9_-]+)\.outputs\.([A-Za-z0-9_-]+) \}\}", output.get("value", ""))
        if not match:
            problems.append(f"{action_path}: output {name} is not a step's output")
            continue
        step = steps.get(match.group(1))
        if step is None or f'echo "{match.group(2)}=' not in step.get("run", ""):
            problems.append(f"{action_path}: output {name}: step {match.group(1)} never writes {match.group(2)}")
    used = 0
    for path in workflow_paths:
        workflow = yaml.safe_load(open(path))
        for job_name, job in workflow.get("jobs", {}).items():
            ids = set()
            for step in job.get("steps", []):
                if step.get("uses") != "./infra/action":
                    continue
                used += 1
                ids.add(step.get("id"))
                for key in step.get("with", {}):
                    if key not in inputs:
                        problems.append(f"{path}: job {job_name} passes {key}, which the action does not take")
            for step in job.get("steps", []):
                for step_id, name in re.findall(r"steps\.([A-Za-z0-9_-]+)\.outputs\.([A-Za-z0-9_-]+)", yaml.safe_dump(step)):
                    if step_id in ids and name not in outputs:
                        problems.append(f"{path}: job {job_name} reads output {name}, which the action does not set")
    if used == 0:
        problems.append("no workflow runs ./infra/action: nothing tests the action")
    for problem in problems:
        print(problem)
    print(f"{action_path}: {len(inputs)} inputs, {len(outputs)} outputs, used by {used} workflow steps: "
          + ("problems above" if problems else "consistent"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
