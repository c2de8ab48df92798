"""Resolve the SAM-transformed template.yaml under many parameter sets and assert what a team is
promised: the cost cap and its off switch, the alarms, the log levels, retention and re-adoption,
the key policy, the git token's context, the optional VPC and the ARN patterns; the age, OpenPGP and key-group
parameters (each reaches the function's environment exactly when set, the sealed private keys
open with the team key under their context, the documented set-up fits Lambda's 4 KB).

cfn-lint cannot see through Fn::If, so this script evaluates the template the way CloudFormation
would: parameter constraints, Rules, Conditions, Fn::If / Ref / Sub / Split / Join, AWS::NoValue.
References to resources become placeholders ("{Ref:Function}", "{GetAtt:StateKey.Arn}") and every
one must name a resource that exists under the same parameters. Parameter sets are generated
(seeded, printed on failure) besides a few fixed ones.

    python tests/tools/check-template.py [template.yaml] [--cases N] [--seed S]
"""

import json
import argparse
import fnmatch
import importlib.util
import os
import random
import re
import sys

from samcli.yamlhelper import yaml_parse

REGION = "eu-west-1"
ACCOUNT = "111122223333"
PSEUDO = {
    "AWS::Region": REGION,
    "AWS::AccountId": ACCOUNT,
    "AWS::Partition": "aws",
    "AWS::StackName": "gitstate-stack",
    "AWS::URLSuffix": "amazonaws.com",
}
NOVALUE = object()

# The log line gitstate-core writes for a failed login, as the Lambda's JSON format nests it.
# tests/it/deploy.rs checks the same pattern against what the function really logs.
FAILED_LOGIN_PATTERN = '{ $.fields.message = "authentication failed" }'
CRYPTO_ACTIONS = [
    "kms:Decrypt",
    "kms:Encrypt",
    "kms:GenerateDataKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
]
KEY_EVENTS = {"DisableKey", "ScheduleKeyDeletion", "PutKeyPolicy"}
# age, OpenPGP and key groups: each parameter and the variable it must set, exactly when not empty.
SOPS_PARAMETERS = {
    "AgeRecipients": "GITSTATE_AGE_RECIPIENTS",
    "AgePreviousRecipients": "GITSTATE_AGE_PREVIOUS_RECIPIENTS",
    "AgeIdentityCiphertext": "GITSTATE_AGE_IDENTITY_KMS",
    "PgpFingerprints": "GITSTATE_PGP_FINGERPRINTS",
    "PgpPreviousFingerprints": "GITSTATE_PGP_PREVIOUS_FINGERPRINTS",
    "PgpPublicKeys": "GITSTATE_PGP_PUBLIC_KEYS",
    "PgpSecretKeysCiphertext": "GITSTATE_PGP_SECRET_KEYS_KMS",
    "SopsShamirThreshold": "GITSTATE_SOPS_SHAMIR_THRESHOLD",
}
# The sealed private keys and the purpose gitstate-kms decrypts each under (with the team).
SEALED_PURPOSES = {"AgeIdentityCiphertext": "age-identity", "PgpSecretKeysCiphertext": "pgp-secret-keys"}
BECH32 = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
# Lambda refuses a function whose environment variables take more than 4 KB in all.
LAMBDA_ENVIRONMENT_BYTES = 4096


class Rejected(Exception):
    """CloudFormation would refuse these parameters before creating anything."""


class Failure(AssertionError):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def load_transform():
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("sam_transform", os.path.join(here, "sam-transform.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transformed(path):
    """The template after the SAM transform, as `sam deploy` would send it."""
    from samtranslator.translator.transform import transform

    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    with open(path, encoding="utf-8") as f:
        template = yaml_parse(f.read())
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = "s3://placeholder-bucket/gitstate-lambda.zip"
    return transform(template, {}, load_transform().NoManagedPolicies())


class Resolved:
    """The template as CloudFormation would create it under `given` parameters."""

    def __init__(self, template, given):
        self.template = template
        self.params = self._parameters(template["Parameters"], given)
        self.conditions = {}
        self.refs = set()
        for name, rule in template.get("Rules", {}).items():
            if "RuleCondition" in rule and not self._truth(rule["RuleCondition"]):
                continue
            for assertion in rule["Assertions"]:
                if not self._truth(assertion["Assert"]):
                    raise Rejected(f"rule {name}: {assertion.get('AssertDescription', '')}")
        self.resources = {}
        for name, resource in template["Resources"].items():
            if "Condition" in resource and not self.condition(resource["Condition"]):
                continue
            self.resources[name] = {k: self.value(v) for k, v in resource.items() if k != "Condition"}
        self.outputs = {
            name: self.value(output["Value"])
            for name, output in template.get("Outputs", {}).items()
            if "Condition" not in output or self.condition(output["Condition"])
        }
        for name, resource in self.resources.items():
            depends = resource.get("DependsOn", [])
            for target in [depends] if isinstance(depends, str) else depends:
                self.refs.add(target)
        dangling = sorted(r for r in self.refs if r not in self.resources)
        check(not dangling, f"references to resources that do not exist: {dangling}")

    @staticmethod
    def _parameters(declared, given):
        unknown = set(given) - set(declared)
        check(not unknown, f"unknown parameters {unknown}")
        params = {}
        for name, spec in declared.items():
            if name in given:
                value = str(given[name])
            elif "Default" in spec:
                value = str(spec["Default"])
            else:
                raise Rejected(f"{name} is required")
            if "AllowedPattern" in spec and not re.fullmatch(spec["AllowedPattern"], value):
                raise Rejected(f"{name}={value!r} does not match its AllowedPattern")
            if "AllowedValues" in spec and value not in [str(v) for v in spec["AllowedValues"]]:
                raise Rejected(f"{name}={value!r} is not an allowed value")
            if spec.get("Type") == "Number":
                number = float(value)
                if "MinValue" in spec and number < spec["MinValue"]:
                    raise Rejected(f"{name}={value} is below its MinValue")
                if "MaxValue" in spec and number > spec["MaxValue"]:
                    raise Rejected(f"{name}={value} is above its MaxValue")
            params[name] = value
        return params

    def condition(self, name):
        if name not in self.conditions:
            self.conditions[name] = self._truth(self.template["Conditions"][name])
        return self.conditions[name]

    def _truth(self, node):
        (fn, args), = node.items()
        if fn == "Condition":
            return self.condition(args)
        if fn == "Fn::Equals":
            a, b = (self.value(x) for x in args)
            return str(a) == str(b)
        if fn == "Fn::Not":
            return not self._truth(args[0])
        if fn == "Fn::And":
            return all(self._truth(x) for x in args)
        if fn == "Fn::Or":
            return any(self._truth(x) for x in args)
        if fn == "Fn::Contains":
            return str(self.value(args[1])) in [str(self.value(x)) for x in args[0]]
        raise Failure(f"unsupported condition function {fn}")

    def _sub(self, text, variables):
        def one(match):
            name = match.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"
            if name in variables:
                return str(variables[name])
            if name in self.params:
                return self.params[name]
            if name in PSEUDO:
                return PSEUDO[name]
            resource = name.split(".")[0]
            self.refs.add(resource)
            return "{GetAtt:" + name + "}" if "." in name else "{Ref:" + name + "}"

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def value(self, node):
        if isinstance(node, list):
            items = [self.value(x) for x in node]
            return [x for x in items if x is not NOVALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (key, args), = node.items()
            if key == "Ref":
                if args == "AWS::NoValue":
                    return NOVALUE
                if args in self.params:
                    return self.params[args]
                if args in PSEUDO:
                    return PSEUDO[args]
                self.refs.add(args)
                return "{Ref:" + args + "}"
            if key == "Fn::GetAtt":
                name, attribute = args.split(".", 1) if isinstance(args, str) else args
                self.refs.add(name)
                return "{GetAtt:" + name + "." + attribute + "}"
            if key == "Fn::If":
                return self.value(args[1] if self.condition(args[0]) else args[2])
            if key == "Fn::Sub":
                if isinstance(args, str):
                    return self._sub(args, {})
                return self._sub(args[0], {k: self.value(v) for k, v in args[1].items()})
            if key == "Fn::Split":
                return str(self.value(args[1])).split(args[0])
            if key == "Fn::Join":
                return args[0].join(str(x) for x in self.value(args[1]))
            if key == "Fn::Select":
                return self.value(args[1])[int(self.value(args[0]))]
            if key.startswith("Fn::"):
                raise Failure(f"unsupported function {key}")
        out = {}
        for k, v in node.items():
            v = self.value(v)
            if v is not NOVALUE:
                out[k] = v
        return out

    # Views used by the assertions.
    def of_type(self, kind):
        return {n: r for n, r in self.resources.items() if r["Type"] == kind}

    def props(self, name):
        return self.resources[name]["Properties"]


def as_list(x):
    return x if isinstance(x, list) else [x]


def grants(statement, action):
    return any(fnmatch.fnmatchcase(action, pattern) for pattern in as_list(statement["Action"]))


def denied(policy, principal_arn, action):
    """Whether an explicit Deny of the key policy applies to `principal_arn` doing `action`
    (the only condition operator the template's Deny uses is ArnNotEquals on aws:PrincipalArn)."""
    for statement in policy["Statement"]:
        if statement["Effect"] != "Deny" or not grants(statement, action):
            continue
        condition = statement.get("Condition", {})
        check(set(condition) <= {"ArnNotEquals"}, f"unexpected Deny condition {condition}")
        exceptions = as_list(condition.get("ArnNotEquals", {}).get("aws:PrincipalArn", []))
        if principal_arn not in exceptions:
            return True
    return False


def context_allows(condition, context):
    """Whether a KMS policy condition (the forms the template uses) lets a request with the
    encryption context `context` through; other condition keys are checked elsewhere."""
    if not condition:
        return True
    for operator, tests in condition.items():
        for key, want in tests.items():
            if operator == "ForAnyValue:StringLike" and key == "kms:EncryptionContextKeys":
                if not any(fnmatch.fnmatchcase(k, w) for k in context for w in as_list(want)):
                    return False
            elif operator == "StringEquals" and key.startswith("kms:EncryptionContext:"):
                if context.get(key.split(":", 2)[2]) not in as_list(want):
                    return False
            elif key != "aws:PrincipalArn":
                raise Failure(f"context_allows: unexpected condition {operator} {key}")
    return True


def environment_bytes(env):
    return sum(len(k.encode()) + len(str(v).encode()) for k, v in env.items())


def assert_properties(r, given):
    """Every promise of the template, under the parameters `r` was resolved with."""
    p = r.params
    team = p["TeamName"]
    root = f"arn:aws:iam::{ACCOUNT}:root"
    role_arn = f"arn:aws:iam::{ACCOUNT}:role/gitstate-{team}-{REGION}"
    log_group = f"/aws/lambda/gitstate-{team}"
    function = r.props("Function")
    env = function["Environment"]["Variables"]
    role = r.props("FunctionRole")
    adopt, external = p["RetainedKeyArn"] != "", p["ExistingKeyArn"] != ""
    own_key = not adopt and not external
    key_arn = p["ExistingKeyArn"] if external else p["RetainedKeyArn"] if adopt else "{GetAtt:StateKey.Arn}"
    context_required = p["RequireEncryptionContext"] == "true"
    gitstate_context = {"ForAnyValue:StringLike": {"kms:EncryptionContextKeys": "gitstate:*"}}

    # The cost cap: on by default, 0 kept as AWS's off switch, -1 the only way to no cap.
    cap = p["ReservedConcurrency"]
    if cap == "-1":
        check("ReservedConcurrentExecutions" not in function, "-1 must leave the function uncapped")
    else:
        check(str(function.get("ReservedConcurrentExecutions")) == cap, f"reserved concurrency must be {cap}")

    # Log levels and tracing.
    logging = function["LoggingConfig"]
    check(logging["LogFormat"] == "JSON", "JSON logs")
    check(logging["SystemLogLevel"] == p["SystemLogLevel"], "SystemLogLevel from its parameter")
    check(logging["ApplicationLogLevel"] == p["LogLevel"], "ApplicationLogLevel from LogLevel")
    check(function["TracingConfig"]["Mode"] == p["Tracing"], "tracing mode from its parameter")
    managed = role.get("ManagedPolicyArns", [])
    xray = "arn:aws:iam::aws:policy/AWSXRayDaemonWriteAccess"
    check((xray in managed) == (p["Tracing"] == "Active"), "X-Ray write access exactly with Active tracing")

    # Retention, and re-adoption of what a deleted stack left.
    function_log_group = logging["LogGroup"]
    if adopt:
        for gone in ("StateKey", "StateKeyAlias", "LogGroup"):
            check(gone not in r.resources, f"RetainedKeyArn: {gone} must not be created again")
        check(function_log_group == log_group, "the retained log group by name")
    else:
        check(function_log_group == "{Ref:LogGroup}", "the stack's log group")
        check(r.props("LogGroup")["LogGroupName"] == log_group, "log group name")
        for kept in ["LogGroup"] + (["StateKey", "StateKeyAlias"] if own_key else []):
            resource = r.resources[kept]
            check(
                resource.get("DeletionPolicy") == "Retain" and resource.get("UpdateReplacePolicy") == "Retain",
                f"{kept} must be retained on deletion and replacement",
            )
    check(("StateKey" in r.resources) == own_key, "a key of its own exactly without Existing/RetainedKeyArn")
    if own_key:
        check(r.props("StateKeyAlias")["AliasName"] == f"alias/gitstate-{team}", "alias name")

    # The role: a fixed name, so the ARN the key policy names stays true across re-creation.
    check(role["RoleName"] == f"gitstate-{team}-{REGION}", "fixed role name")
    check(len(role["RoleName"]) <= 64, "IAM role names are at most 64 characters")
    check(function["Role"] == "{GetAtt:FunctionRole.Arn}", "function runs as the role")
    policies = {policy["PolicyName"]: policy["PolicyDocument"]["Statement"] for policy in role["Policies"]}
    logs_resource = policies["logs"][0]["Resource"]
    check(
        logs_resource == ("{GetAtt:LogGroup.Arn}" if not adopt
                          else f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{log_group}:*"),
        f"the role writes to the function's log group only, not {logs_resource}",
    )
    (state_key,) = policies["state-key"]
    check(state_key["Resource"] == key_arn, "the role may use the key in use")
    check(set(as_list(state_key["Action"])) == {"kms:GenerateDataKey", "kms:Encrypt", "kms:Decrypt"}, "data key actions only")
    check((state_key.get("Condition") == gitstate_context) == context_required, "context condition on the state key")
    if p["PreviousKeyArns"]:
        (previous,) = policies["previous-state-keys"]
        check(previous["Resource"] == p["PreviousKeyArns"].split(","), "previous keys")
        check(as_list(previous["Action"]) == ["kms:Decrypt"], "previous keys only decrypt")
        check((previous.get("Condition") == gitstate_context) == context_required, "context condition on previous keys")
    else:
        check("previous-state-keys" not in policies, "no previous keys")
    if p["GitTokenCiphertext"] and p["GitTokenKeyArn"]:
        (token,) = policies["git-token-key"]
        check(token["Condition"] == {"StringEquals": {
            "kms:EncryptionContext:gitstate:purpose": "git-token",
            "kms:EncryptionContext:gitstate:team": team,
        }}, "the token key opens only this team's git token")
    else:
        check("git-token-key" not in policies, "no separate token key")

    # The key policy as docs/operating.md says it.
    if own_key:
        policy = r.props("StateKey")["KeyPolicy"]
        admin = p["KeyAdminPrincipalArn"]
        allowed = [role_arn] + ([admin] if admin else [])
        text = repr(policy)
        check("FunctionRole" not in text, "the key policy names the role by a string ARN, never a reference")
        for statement in policy["Statement"]:
            if statement["Effect"] != "Allow" or not any(grants(statement, a) for a in CRYPTO_ACTIONS):
                continue
            check(statement["Principal"] == {"AWS": root}, "crypto allowed through the account, by ARN condition")
            names = as_list(statement["Condition"]["ArnEquals"]["aws:PrincipalArn"])
            check(set(names) <= set(allowed), f"crypto allowed to {names}")
            if role_arn in names and context_required:
                check(statement["Condition"].get("ForAnyValue:StringLike") == gitstate_context["ForAnyValue:StringLike"],
                      "the role's data keys need a gitstate: context")
        others = [
            root,
            f"arn:aws:iam::{ACCOUNT}:role/Admin",
            f"arn:aws:iam::{ACCOUNT}:role/gitstate-{team}-{REGION}x",
            f"arn:aws:iam::{ACCOUNT}:user/{team}",
            f"arn:aws:iam::{ACCOUNT}:role/gitstate-other-{REGION}",
        ] + ([] if admin else [f"arn:aws:iam::{ACCOUNT}:role/{team}-admin"])
        for action in CRYPTO_ACTIONS:
            for principal in others:
                if principal not in allowed:
                    check(denied(policy, principal, action), f"{principal} must be denied {action}")
            for principal in allowed:
                check(not denied(policy, principal, action), f"{principal} must not be denied {action}")
        administration = next(s for s in policy["Statement"] if s.get("Sid") == "KeyAdministrationByIam")
        check(not any(grants(administration, a) for a in CRYPTO_ACTIONS), "administration grants no cryptography")

    # Environment: the key in use, the team for the token's context, no plaintext secret.
    check(env["GITSTATE_KMS_KEY_IDS"] == key_arn, "GITSTATE_KMS_KEY_IDS is the key in use")
    check(env["GITSTATE_TEAM"] == team, "GITSTATE_TEAM binds the git token to the team")
    check("GITSTATE_ADMIN_HASH" not in env and "GITSTATE_GIT_TOKEN" not in env, "no secret in clear in the environment")
    check(env["GITSTATE_ADMIN_HASH_KMS"] == p["AdminHashCiphertext"], "the admin hash sealed")
    check(env["GITSTATE_GIT_TOKEN_KMS"] == p["GitTokenCiphertext"], "the git token sealed")
    for name, spec in r.template["Parameters"].items():
        if name.endswith("Ciphertext"):
            check(spec.get("NoEcho") is True, f"{name} is NoEcho")
    check(env.get("GITSTATE_KMS_PREVIOUS_KEY_IDS", "") == p["PreviousKeyArns"], "previous keys in the environment")

    # age, OpenPGP and key groups: each variable exactly when its parameter is set, as given;
    # nothing (not even an empty variable) otherwise.
    for param, var in SOPS_PARAMETERS.items():
        if p[param]:
            check(env.get(var) == p[param], f"{param} must reach {var}")
        else:
            check(var not in env, f"{var} must be absent while {param} is empty")
    check(not any(v in env for v in ("GITSTATE_AGE_IDENTITY", "GITSTATE_PGP_SECRET_KEYS", "GITSTATE_PGP_PASSPHRASE")),
          "no private key or passphrase in clear in the environment")
    for param in SEALED_PURPOSES:
        check(r.template["Parameters"][param].get("NoEcho") is True, f"{param} is NoEcho")
    # The sealed private keys open with the team key under the context gitstate-kms uses
    # (purpose and team): the role's policy and the key policy must both let it through, and
    # the same blob under another purpose or without the team must not pass the token key's
    # narrower grant.
    for param, purpose in SEALED_PURPOSES.items():
        context = {"gitstate:purpose": purpose, "gitstate:team": team}
        check(grants(state_key, "kms:Decrypt") and context_allows(state_key.get("Condition"), context),
              f"the role may decrypt {param} ({purpose}) with the key in use")
        if own_key:
            policy = r.props("StateKey")["KeyPolicy"]
            allowing = [
                st for st in policy["Statement"]
                if st["Effect"] == "Allow" and grants(st, "kms:Decrypt")
                and role_arn in as_list(st.get("Condition", {}).get("ArnEquals", {}).get("aws:PrincipalArn", []))
                and context_allows(st.get("Condition"), context)
            ]
            check(allowing, f"the key policy lets the role decrypt {param} ({purpose})")
            check(not denied(policy, role_arn, "kms:Decrypt"), "the role is not denied Decrypt")
        if "git-token-key" in policies:
            (token,) = policies["git-token-key"]
            check(not context_allows(token["Condition"], context),
                  f"the token key's grant must not open {param}: seal it under the team key")
    check(env["GITSTATE_RESPONSE_STREAMING"] == ("true" if p["InvokeMode"] == "RESPONSE_STREAM" else "false"),
          "streaming runtime exactly with a streaming URL")
    check(r.props("FunctionUrl")["InvokeMode"] == p["InvokeMode"], "URL invoke mode")

    # VPC.
    vpc = p["VpcSubnetIds"] != ""
    vpc_policy = "arn:aws:iam::aws:policy/service-role/AWSLambdaVPCAccessExecutionRole"
    if vpc:
        check(function["VpcConfig"] == {"SubnetIds": p["VpcSubnetIds"].split(","),
                                        "SecurityGroupIds": p["VpcSecurityGroupIds"].split(",")}, "VpcConfig")
        check(vpc_policy in managed, "VPC access for the role")
    else:
        check("VpcConfig" not in function and vpc_policy not in managed, "no VPC unless asked")

    # Alarms.
    topic = p["AlarmTopicArn"]
    alarms = r.of_type("AWS::CloudWatch::Alarm")
    filters = r.of_type("AWS::Logs::MetricFilter")
    every_rule = r.of_type("AWS::Events::Rule")
    schedules = {n: x for n, x in every_rule.items() if "ScheduleExpression" in x["Properties"]}
    rules = {n: x for n, x in every_rule.items() if n not in schedules}
    check_fold_schedule(r, schedules)
    if not topic:
        check(not alarms and not filters and not rules, "no alarm resources without AlarmTopicArn")
        return
    by_metric = {}
    for name, alarm in alarms.items():
        props = alarm["Properties"]
        check(props["AlarmActions"] == [topic] and props["OKActions"] == [topic], f"{name} notifies the topic")
        check(props["TreatMissingData"] == "notBreaching", f"{name}: no data is no alarm")
        if "MetricName" in props:
            by_metric[props["MetricName"]] = props
        else:
            stats = [m["MetricStat"] for m in props["Metrics"] if "MetricStat" in m]
            by_metric[stats[0]["Metric"]["MetricName"]] = props
    want = {"Url5xxCount", "Throttles", "Errors", "UrlRequestCount", "Duration", "FailedLogins"}
    check(set(by_metric) == want, f"alarms on {sorted(by_metric)}, want {sorted(want)}")
    function_dimension = [{"Name": "FunctionName", "Value": "{Ref:Function}"}]
    for metric in ("Url5xxCount", "Throttles", "Errors", "UrlRequestCount"):
        check(by_metric[metric]["Namespace"] == "AWS/Lambda", metric)
        check(by_metric[metric]["Dimensions"] == function_dimension, f"{metric} of this function")
        check(by_metric[metric]["Statistic"] == "Sum", f"{metric} summed")
    check(str(by_metric["UrlRequestCount"]["Threshold"]) == p["AlarmRequestsPerHour"]
          and by_metric["UrlRequestCount"]["Period"] == 3600, "request ceiling per hour")
    check(by_metric["Throttles"]["Threshold"] == 0, "any throttle alarms")
    duration = by_metric["Duration"]
    (stat,) = [m["MetricStat"] for m in duration["Metrics"] if "MetricStat" in m]
    (expression,) = [m for m in duration["Metrics"] if "Expression" in m]
    check(stat["Stat"] == "p99" and stat["Metric"]["Dimensions"] == function_dimension, "p99 duration")
    timeout_ms = int(p["Timeout"]) * 1000
    share = eval(expression["Expression"].replace("p99", "1"), {"__builtins__": {}})  # noqa: S307
    check(abs(share - 1 / timeout_ms) < 1e-12, f"duration divided by the timeout: {expression['Expression']}")
    check(expression["ReturnData"] and 0.5 <= duration["Threshold"] < 1, "alarm before the timeout")
    (metric_filter,) = filters.values()
    mf = metric_filter["Properties"]
    check(mf["FilterPattern"] == FAILED_LOGIN_PATTERN, f"failed-login filter pattern {mf['FilterPattern']}")
    check(mf["LogGroupName"] == function_log_group, "the filter reads the function's log group")
    (transformation,) = mf["MetricTransformations"]
    logins = by_metric["FailedLogins"]
    check((logins["Namespace"], logins["MetricName"]) == (transformation["MetricNamespace"], transformation["MetricName"]),
          "the failed-login alarm watches the filter's metric")
    check(str(logins["Threshold"]) == p["AlarmFailedLoginsPer5Minutes"], "failed-login threshold")
    check(p["LogLevel"] in ("TRACE", "DEBUG", "INFO", "WARN"), "failed logins are WARN lines: they must be logged")
    if external:
        check(not rules, "no key alarm for a key the stack does not own")
    else:
        (rule,) = rules.values()
        pattern = rule["Properties"]["EventPattern"]
        check(pattern["source"] == ["aws.kms"], "KMS events")
        check(KEY_EVENTS <= set(pattern["detail"]["eventName"]), f"key events {pattern['detail']['eventName']}")
        check(pattern["detail"]["resources"]["ARN"] == [key_arn], "events of the key in use")
        check([t["Arn"] for t in rule["Properties"]["Targets"]] == [topic], "key events go to the topic")


def check_fold_schedule(r, schedules):
    """The fold schedule (docs/operating.md, "Unfolded writes"): every minute, the function with
    the fold's input, and EventBridge allowed to invoke it."""
    (schedule,) = schedules.values()
    props = schedule["Properties"]
    check(props["ScheduleExpression"] == "rate(1 minute)", f"fold every minute: {props['ScheduleExpression']}")
    check(props.get("State", "ENABLED") == "ENABLED", "the fold schedule is enabled")
    (target,) = props["Targets"]
    check(json.loads(target["Input"]) == {"gitstate": "fold"}, f"the fold's input {target['Input']}")
    names_function = lambda x: "Function.Arn" in json.dumps(x) or x == {"Ref": "Function"}  # noqa: E731
    check(names_function(target["Arn"]), f"the schedule invokes the function: {target['Arn']}")
    permissions = [p["Properties"] for p in r.of_type("AWS::Lambda::Permission").values()]
    check(any(p["Principal"] == "events.amazonaws.com" and p["Action"] == "lambda:InvokeFunction"
              and (names_function(p["FunctionName"]) or "Function" in json.dumps(p["FunctionName"]))
              for p in permissions),
          "EventBridge may invoke the function")


def arn_cases(rng):
    """Generated ARN parameter values: (parameter, value, accepted?)."""
    def key():
        region = rng.choice(["eu-west-1", "us-east-1", "ap-southeast-3", "us-gov-west-1"])
        partition = "aws-us-gov" if region.startswith("us-gov") else rng.choice(["aws", "aws-cn"])
        key_id = "".join(rng.choice("0123456789abcdef") for _ in range(8)) + "-1234-5678-9abc-def012345678"
        return f"arn:{partition}:kms:{region}:{rng.randrange(10**11, 10**12):012d}:key/{key_id}"

    def principal():
        kind = rng.choice(["role", "user"])
        path = rng.choice(["", "ops/", "a/b/"])
        name = rng.choice(["admin", "platform-admin", "Break.Glass+x@y=z,w_v"])
        return f"arn:aws:iam::{rng.randrange(10**11, 10**12):012d}:{kind}/{path}{name}"

    def topic():
        return f"arn:aws:sns:{rng.choice(['eu-west-1', 'us-east-1'])}:{ACCOUNT}:gitstate-{rng.randrange(1000)}"

    cases = []
    for _ in range(20):
        k = key()
        for param in ("ExistingKeyArn", "RetainedKeyArn", "GitTokenKeyArn", "PreviousKeyArns"):
            cases.append((param, k, True))
            cases.append((param, k.replace(":key/", ":alias/"), False))  # an alias ARN grants nothing in IAM
            cases.append((param, k.replace(f":{k.split(':')[4]}:", "::"), False))  # no account
            cases.append((param, k + " ", False))
            cases.append((param, " " + k, False))
        cases.append(("PreviousKeyArns", f"{k},{key()}", True))
        cases.append(("PreviousKeyArns", f"{k}, {key()}", False))
        cases.append(("PreviousKeyArns", f"{k},", False))
        a = principal()
        cases.append(("KeyAdminPrincipalArn", a, True))
        cases.append(("KeyAdminPrincipalArn", a.replace("iam::", "iam:eu-west-1:"), False))
        cases.append(("KeyAdminPrincipalArn", a.replace(":role/", ":group/").replace(":user/", ":group/"), False))
        cases.append(("KeyAdminPrincipalArn", a.split("/")[-1], False))
        t = topic()
        cases.append(("AlarmTopicArn", t, True))
        cases.append(("AlarmTopicArn", t.replace(":sns:", ":sqs:"), False))
        cases.append(("AlarmTopicArn", t + "/x", False))
    for param in ("ExistingKeyArn", "RetainedKeyArn", "GitTokenKeyArn", "PreviousKeyArns", "KeyAdminPrincipalArn", "AlarmTopicArn"):
        cases.append((param, "", True))
    return cases


def age_recipient(rng):
    return "age1" + "".join(rng.choice(BECH32) for _ in range(58))


def fingerprint(rng):
    return "".join(rng.choice("0123456789ABCDEF" if rng.random() < 0.8 else "0123456789abcdef") for _ in range(40))


def armored_public(rng):
    """An armored public key's shape (as gpg --armor --export prints a Curve25519 key), with its
    newlines kept or flattened to spaces as a one-line parameter has them."""
    body = [
        "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(64))
        for _ in range(9)
    ]
    lines = ["-----BEGIN PGP PUBLIC KEY BLOCK-----", ""] + body + ["=jDiZ", "-----END PGP PUBLIC KEY BLOCK-----"]
    return " ".join(x for x in lines if x) if rng.random() < 0.5 else "\n".join(lines)


def sops_cases(rng):
    """Generated values of the age and OpenPGP list parameters: (parameter, value, accepted?)."""
    cases = []
    for _ in range(20):
        for param in ("AgeRecipients", "AgePreviousRecipients"):
            a, b = age_recipient(rng), age_recipient(rng)
            cases += [
                (param, a, True),
                (param, f"{a},{b}", True),
                (param, f"{a}, {b}", False),
                (param, f"{a},", False),
                (param, a[:-1], False),  # one character short
                (param, a + "q", False),
                (param, a.upper(), False),  # bech32 here is lowercase
                (param, a[:10] + "b" + a[11:], False),  # b is not a bech32 character
                (param, "AGE-SECRET-KEY-1" + a[4:].upper(), False),  # an identity, not a recipient
            ]
        for param in ("PgpFingerprints", "PgpPreviousFingerprints"):
            f, g = fingerprint(rng), fingerprint(rng)
            cases += [
                (param, f, True),
                (param, f"{f},{g}", True),
                (param, f"{f}, {g}", False),
                (param, f[:-1], False),
                (param, f[:-8], False),  # a long key ID, not a fingerprint
                (param, " ".join(f[i:i + 4] for i in range(0, 40, 4)), False),  # gpg's spaced display
                (param, f[:5] + "G" + f[6:], False),
                (param, "0x" + f, False),
            ]
    cases += [(param, "", True) for param in ("AgeRecipients", "AgePreviousRecipients", "PgpFingerprints", "PgpPreviousFingerprints")]
    cases += [("SopsShamirThreshold", t, t in ("", "1")) for t in ("", "1", "2", "3", "0", "4", "-1", "1.0", " 1")]
    return cases


def random_parameters(rng):
    team = rng.choice(["platform", "payments", "a1", "data-eng", "x" * 40])
    key = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{rng.randrange(10**8):08d}-0000-4000-8000-000000000000"
    key2 = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{rng.randrange(10**8):08d}-1111-4000-8000-000000000000"
    p = {"TeamName": team, "Repository": "https://git.example.com/acme/state.git"}
    choice = rng.random
    source = choice()
    if source < 0.3:
        p["ExistingKeyArn"] = key
    if 0.27 < source < 0.55:
        p["RetainedKeyArn"] = key2
    if choice() < 0.5:
        p["KeyAdminPrincipalArn"] = f"arn:aws:iam::{ACCOUNT}:role/{team}-admin"
    if choice() < 0.3:
        p["PreviousKeyArns"] = ",".join([key2, key][: rng.randint(1, 2)])
    if choice() < 0.5:
        p["GitTokenCiphertext"] = "AQICAHh" + "A" * rng.randint(1, 40)
    if choice() < 0.5:
        p["AdminHashCiphertext"] = "AQICAHi" + "B" * rng.randint(1, 40)
    if choice() < 0.3:
        p["GitTokenKeyArn"] = key2
    p["RequireEncryptionContext"] = rng.choice(["true", "false"])
    p["ReservedConcurrency"] = str(rng.choice([-1, 0, 1, 2, 10, 50, rng.randint(1, 1000)]))
    p["InvokeMode"] = rng.choice(["BUFFERED", "RESPONSE_STREAM"])
    p["LogLevel"] = rng.choice(["TRACE", "DEBUG", "INFO", "INFO", "WARN", "WARN"] * 4 + ["ERROR", "FATAL"])
    p["SystemLogLevel"] = rng.choice(["DEBUG", "INFO", "WARN"])
    p["Tracing"] = rng.choice(["PassThrough", "Active"])
    p["Timeout"] = str(rng.choice([10, 60, 900, rng.randint(10, 900)]))
    vpc = choice()
    if vpc < 0.3:
        p["VpcSubnetIds"] = ",".join(f"subnet-{rng.randrange(16**8):08x}" for _ in range(rng.randint(1, 3)))
        p["InvokeMode"] = "BUFFERED" if choice() < 0.9 else "RESPONSE_STREAM"
    if vpc < 0.27 or 0.3 <= vpc < 0.33:
        p["VpcSecurityGroupIds"] = ",".join(f"sg-{rng.randrange(16**8):08x}" for _ in range(rng.randint(1, 2)))
    # age, OpenPGP and key groups, each set or not, in sizes a team would use (Curve25519
    # OpenPGP keys; ciphertexts as long as KMS makes them for such keys).
    if choice() < 0.4:
        p["AgeRecipients"] = ",".join(age_recipient(rng) for _ in range(rng.randint(1, 3)))
    if choice() < 0.2:
        p["AgePreviousRecipients"] = ",".join(age_recipient(rng) for _ in range(rng.randint(1, 2)))
    if choice() < 0.3:
        p["AgeIdentityCiphertext"] = "AQICAHj" + "C" * rng.randint(1, 400)
    if choice() < 0.3:
        p["PgpFingerprints"] = ",".join(fingerprint(rng) for _ in range(rng.randint(1, 2)))
    if choice() < 0.2:
        p["PgpPreviousFingerprints"] = fingerprint(rng)
    if p.get("PgpFingerprints") or choice() < 0.1:
        if choice() < 0.95:
            p["PgpPublicKeys"] = armored_public(rng)
    if choice() < 0.2:
        p["PgpSecretKeysCiphertext"] = "AQICAHk" + "D" * rng.randint(1, 1300)
    if choice() < 0.4:
        p["SopsShamirThreshold"] = rng.choice(["1", "2", "2", "3"])
    if choice() < 0.5:
        p["AlarmTopicArn"] = f"arn:aws:sns:{REGION}:{ACCOUNT}:gitstate-alarms"
        p["AlarmRequestsPerHour"] = str(rng.randint(1, 100000))
        p["AlarmFailedLoginsPer5Minutes"] = str(rng.randint(1, 1000))
    return p


def expected_rejection(p):
    """Why CloudFormation must refuse `p` (the template's Rules), independently of the template."""
    if p.get("ExistingKeyArn") and p.get("RetainedKeyArn"):
        return "OneKeySource"
    if bool(p.get("VpcSubnetIds")) != bool(p.get("VpcSecurityGroupIds")):
        return "VpcNeedsBoth"
    if p.get("VpcSubnetIds") and p.get("InvokeMode") == "RESPONSE_STREAM":
        return "NoStreamingInVpc"
    if p.get("PgpFingerprints") and not p.get("PgpPublicKeys"):
        return "PgpNeedsPublicKeys"
    groups = 1 + bool(p.get("AgeRecipients")) + bool(p.get("PgpFingerprints"))
    if p.get("SopsShamirThreshold") and int(p["SopsShamirThreshold"]) > groups:
        return "ThresholdWithinSources"
    if p.get("AlarmTopicArn") and p.get("LogLevel") in ("ERROR", "FATAL"):
        return "FailedLoginsNeedWarn"
    return None


FIXED = [
    # The defaults: a cap of 10, INFO system logs, no alarms.
    {},
    # The off switch and no cap.
    {"ReservedConcurrency": "0"},
    {"ReservedConcurrency": "-1"},
    # Everything on.
    {
        "AlarmTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:ops",
        "KeyAdminPrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/platform-admin",
        "GitTokenCiphertext": "AQICAHhx",
        "GitTokenKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "PreviousKeyArns": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/0000abcd-12ab-34cd-56ef-1234567890ab",
        "Tracing": "Active",
        "VpcSubnetIds": "subnet-0123abcd,subnet-4567ef01",
        "VpcSecurityGroupIds": "sg-0123abcd",
    },
    # The example: a KMS group for the Lambda and an age group kept offline (recipient
    # only, no identity in the function), 2 of 2.
    {
        "AgeRecipients": "age14844zydulj93zglc7ye28fzm7f5g6v5s0ju9jarpwr0jyxvcuyeqeas4dz",
        "SopsShamirThreshold": "1",
    },
    # Every age and OpenPGP parameter, three groups, a separate token key beside them.
    {
        "AgeRecipients": "age14844zydulj93zglc7ye28fzm7f5g6v5s0ju9jarpwr0jyxvcuyeqeas4dz",
        "AgePreviousRecipients": "age1a9rwlah9xp9hmz3u9lk8czpvvxdq494r22hrsdy0e78q2e0hlf3su5pq8j",
        "AgeIdentityCiphertext": "AQICAHjA",
        "PgpFingerprints": "FE9CA9C410896ED88599552C927D9EE740F93843",
        "PgpPreviousFingerprints": "0123456789abcdef0123456789abcdef01234567",
        "PgpPublicKeys": "-----BEGIN PGP PUBLIC KEY BLOCK----- mDMEawYt3hYJKwYBBAHaRw8BAQdAdPYo =jDiZ -----END PGP PUBLIC KEY BLOCK-----",
        "PgpSecretKeysCiphertext": "AQICAHkA",
        "SopsShamirThreshold": "3",
        "GitTokenCiphertext": "AQICAHhx",
        "GitTokenKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    },
    # Re-adopting a retained key, with alarms.
    {
        "RetainedKeyArn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "AlarmTopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:ops",
    },
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("template", nargs="?", default="template.yaml")
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHECK_TEMPLATE_SEED", "0")) or random.randrange(1 << 30))
    args = parser.parse_args()
    template = transformed(args.template)
    base = {"TeamName": "platform", "Repository": "https://git.example.com/acme/state.git"}
    rng = random.Random(args.seed)
    failures = []
    counts = {"accepted": 0, "rejected": 0}

    defaults = Resolved(template, base)
    check(defaults.props("Function")["ReservedConcurrentExecutions"] == "10", "the default cap is 10")
    check(defaults.props("Function")["LoggingConfig"]["SystemLogLevel"] == "INFO", "SystemLogLevel INFO by default")

    cases = [dict(base, **fixed) for fixed in FIXED] + [random_parameters(rng) for _ in range(args.cases)]
    for given in cases:
        want = expected_rejection(given)
        try:
            resolved = Resolved(template, given)
        except Rejected as refused:
            counts["rejected"] += 1
            if want is None or want not in str(refused):
                failures.append(f"{given}: refused ({refused}), expected {want or 'acceptance'}")
            continue
        except Failure as failure:
            failures.append(f"{given}: {failure}")
            continue
        counts["accepted"] += 1
        if want is not None:
            failures.append(f"{given}: accepted, expected refusal by rule {want}")
            continue
        try:
            assert_properties(resolved, given)
        except Failure as failure:
            failures.append(f"{given}: {failure}")

    arns = arn_cases(rng)
    for param, value, ok in arns:
        given = dict(base, **{param: value})
        if param == "GitTokenKeyArn":
            given["GitTokenCiphertext"] = "AQICAHhx"
        try:
            Resolved(template, given)
            accepted = True
        except Rejected:
            accepted = False
        if accepted != ok:
            failures.append(f"{param}={value!r}: {'accepted' if accepted else 'refused'}, expected the opposite")

    sops = sops_cases(rng)
    for param, value, ok in sops:
        given = dict(base, **{param: value})
        if param == "PgpFingerprints":
            given["PgpPublicKeys"] = armored_public(rng)
        try:
            Resolved(template, given)
            accepted = True
        except Rejected:
            accepted = False
        if accepted != ok:
            failures.append(f"{param}={value!r}: {'accepted' if accepted else 'refused'}, expected the opposite")

    # The documented Lambda set-up fits Lambda's 4 KB of environment: one age key and one
    # Curve25519 OpenPGP key, both opened by the function, three groups, beside a git token and an
    # admin hash, the longest team name and a real key ARN (KMS ciphertext = plaintext + at most
    # 200 bytes, then base64). Previous recipients or fingerprints on top of all of it (while
    # rotating) may not fit: docs/operating.md says so.
    def sealed(plaintext_bytes):
        return "A" * (4 * -(-(plaintext_bytes + 200) // 3))

    full = dict(
        base,
        Repository="https://git.example.com/platform-engineering/terraform-states-production.git",
        TeamName="x" * 40,
        ExistingKeyArn=f"arn:aws:kms:{REGION}:{ACCOUNT}:key/0000abcd-12ab-34cd-56ef-1234567890ab",
        GitUsername="gitstate-bot",
        GitTokenCiphertext=sealed(40),
        AdminHashCiphertext=sealed(100),
        AgeRecipients=age_recipient(rng),
        AgeIdentityCiphertext=sealed(75),
        PgpFingerprints=fingerprint(rng),
        PgpPublicKeys=armored_public(rng),
        PgpSecretKeysCiphertext=sealed(760),
        SopsShamirThreshold="3",
    )
    full_env = Resolved(template, full).props("Function")["Environment"]["Variables"]
    full_bytes = environment_bytes(full_env)
    if full_bytes > LAMBDA_ENVIRONMENT_BYTES:
        failures.append(f"one age and one Curve25519 OpenPGP key opened by the function: {full_bytes} bytes of environment, "
                        f"above Lambda's {LAMBDA_ENVIRONMENT_BYTES}")

    for failure in failures[:20]:
        print(f"check-template: {failure}", file=sys.stderr)
    print(
        f"check-template: {len(cases)} parameter sets ({counts['accepted']} accepted and checked, "
        f"{counts['rejected']} refused by the rules), {len(arns)} ARN values, {len(sops)} age/OpenPGP values, "
        f"full age+OpenPGP environment {full_bytes}/{LAMBDA_ENVIRONMENT_BYTES} bytes, seed {args.seed}: "
        f"{len(failures)} failures"
    )
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
