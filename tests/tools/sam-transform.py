"""Print template.yaml after the SAM transform, as CloudFormation JSON, offline.

cfn-lint transforms SAM templates itself but does not report errors inside the resources the
transform generates (a bad Runtime or InvokeMode of an AWS::Serverless::Function passes), and
`sam validate --lint` does the same; linting this output catches them. The code location is
replaced by a placeholder, as `sam package` would replace it by an S3 URI.
"""

import json
import os
import sys

from samcli.yamlhelper import yaml_parse
from samtranslator.translator.transform import transform


class NoManagedPolicies:
    """The template names no managed policies by name, so no IAM lookup is needed."""

    def load(self):
        return {}


def main(path):
    # The transform resolves pseudo parameters from a region; any region will do offline.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with open(path, encoding="utf-8") as f:
        template = yaml_parse(f.read())
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") == "AWS::Serverless::Function":
            resource["Properties"]["CodeUri"] = "s3://placeholder-bucket/gitstate-lambda.zip"
    output = transform(template, {}, NoManagedPolicies())
    json.dump(output, sys.stdout, indent=2, sort_keys=True)
    print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "template.yaml")
