# Post-deploy smoke test: one terraform_data resource (no provider download) whose state lives in
# a deployed gitstate backend. The backend is configured at init time (partial configuration):
# infra/smoke/run passes the addresses with -backend-config, credentials come from
# TF_HTTP_USERNAME / TF_HTTP_PASSWORD.
terraform {
  required_version = ">= 1.5.0"
  backend "http" {}
}

variable "run_id" {
  description = "Changes on every smoke run, so each apply writes a new state serial."
  type        = string
}

resource "terraform_data" "smoke" {
  input = var.run_id
}

output "run_id" {
  value = terraform_data.smoke.output
}
