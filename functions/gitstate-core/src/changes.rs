//! What a version of a state holds and what it changed, by resource address and output name.
//!
//! States hold secrets: a [`Summary`] keeps addresses, types and output names, and of every value
//! only a SHA-256 digest, so two versions can be compared without any value ever leaving here.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One resource instance of a state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// Terraform's resource type (`aws_s3_bucket`).
    pub kind: String,
    /// `managed` or `data`.
    pub mode: String,
    digest: [u8; 32],
}

/// The addresses of a state's resources and the names of its outputs, with digests of their
/// values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub resources: BTreeMap<String, Resource>,
    outputs: BTreeMap<String, [u8; 32]>,
}

/// What one version changed against the one before it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    /// Outputs added, removed or given another value (names only).
    pub outputs: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty()
            && self.removed.is_empty()
            && self.changed.is_empty()
            && self.outputs.is_empty()
    }
}

#[derive(Deserialize)]
struct StateFile {
    #[serde(default)]
    resources: Vec<StateResource>,
    #[serde(default)]
    outputs: BTreeMap<String, Value>,
    /// OpenTofu's client-side encryption: nothing inside is readable.
    #[serde(default)]
    encrypted_data: Option<Value>,
}

#[derive(Deserialize)]
struct StateResource {
    #[serde(default)]
    module: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    instances: Vec<Value>,
}

fn digest(value: &Value) -> [u8; 32] {
    // serde_json writes a map's keys in order, so equal values give equal bytes.
    Sha256::digest(serde_json::to_vec(value).unwrap_or_default()).into()
}

/// `[0]` or `["key"]`, as Terraform writes an instance key in an address.
fn index_suffix(key: Option<&Value>) -> String {
    match key {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => format!("[{}]", Value::String(s.clone())),
        Some(other) => format!("[{other}]"),
    }
}

impl Summary {
    /// The summary of a Terraform state (format 4); `None` when the content is not one (an
    /// OpenTofu-encrypted state, or not JSON at all).
    pub fn of(state: &[u8]) -> Option<Self> {
        let file: StateFile = serde_json::from_slice(state).ok()?;
        if file.encrypted_data.is_some() {
            return None;
        }
        let mut summary = Self::default();
        for resource in file.resources {
            let mode = resource.mode.unwrap_or_else(|| "managed".into());
            let mut base = String::new();
            if let Some(module) = resource.module.filter(|m| !m.is_empty()) {
                base.push_str(&module);
                base.push('.');
            }
            if mode == "data" {
                base.push_str("data.");
            }
            base.push_str(&resource.kind);
            base.push('.');
            base.push_str(&resource.name);
            for instance in &resource.instances {
                let address = format!("{base}{}", index_suffix(instance.get("index_key")));
                summary.resources.insert(
                    address,
                    Resource {
                        kind: resource.kind.clone(),
                        mode: mode.clone(),
                        digest: digest(instance),
                    },
                );
            }
        }
        summary.outputs = file
            .outputs
            .iter()
            .map(|(name, value)| (name.clone(), digest(value)))
            .collect();
        Some(summary)
    }

    /// What `self` changed against `before` (`None`: the state did not exist before).
    pub fn changes_since(&self, before: Option<&Self>) -> Changes {
        let empty = Self::default();
        let before = before.unwrap_or(&empty);
        let mut changes = Changes::default();
        for (address, resource) in &self.resources {
            match before.resources.get(address) {
                None => changes.added.push(address.clone()),
                Some(old) if old.digest != resource.digest => changes.changed.push(address.clone()),
                Some(_) => {}
            }
        }
        changes.removed = before
            .resources
            .keys()
            .filter(|address| !self.resources.contains_key(*address))
            .cloned()
            .collect();
        let mut outputs: Vec<String> = self
            .outputs
            .iter()
            .filter(|(name, value)| before.outputs.get(*name) != Some(value))
            .map(|(name, _)| name.clone())
            .chain(
                before
                    .outputs
                    .keys()
                    .filter(|name| !self.outputs.contains_key(*name))
                    .cloned(),
            )
            .collect();
        outputs.sort();
        changes.outputs = outputs;
        changes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    use super::*;

    /// A random state: resources with count/for_each/no keys, in and out of modules, managed
    /// and data, with attribute values; outputs.
    fn random_state(rng: &mut StdRng) -> (Value, BTreeSet<String>) {
        let mut resources = Vec::new();
        let mut addresses = BTreeSet::new();
        for r in 0..rng.random_range(0..8) {
            let module = rng
                .random_bool(0.3)
                .then(|| format!("module.m{}", rng.random_range(0..3)));
            let data = rng.random_bool(0.2);
            let (kind, name) = (format!("t{}", rng.random_range(0..3)), format!("r{r}"));
            let keyed = rng.random_range(0..3);
            let mut instances = Vec::new();
            for i in 0..rng.random_range(1..4) {
                let key = match keyed {
                    0 if i == 0 => Value::Null,
                    0 => break,
                    1 => json!(i),
                    _ => json!(format!("k\"{i}")),
                };
                let prefix = module.as_ref().map(|m| format!("{m}.")).unwrap_or_default();
                let data_part = if data { "data." } else { "" };
                addresses.insert(format!(
                    "{prefix}{data_part}{kind}.{name}{}",
                    index_suffix(Some(&key))
                ));
                let mut instance =
                    json!({"attributes": {"secret": format!("SECRET-{}", rng.random::<u32>())}});
                if !key.is_null() {
                    instance["index_key"] = key;
                }
                instances.push(instance);
            }
            let mut resource = json!({"mode": if data {"data"} else {"managed"}, "type": kind, "name": name, "instances": instances});
            if let Some(module) = module {
                resource["module"] = json!(module);
            }
            resources.push(resource);
        }
        let outputs: serde_json::Map<String, Value> = (0..rng.random_range(0..4))
            .map(|o| (format!("o{o}"), json!({"value": rng.random::<u32>()})))
            .collect();
        (
            json!({"version": 4, "serial": 1, "lineage": "L", "resources": resources, "outputs": outputs}),
            addresses,
        )
    }

    fn summary(state: &Value) -> Summary {
        Summary::of(serde_json::to_vec(state).expect("json").as_slice()).expect("a state")
    }

    #[test]
    fn addresses_are_terraform_s() {
        for seed in 0..300 {
            let (state, addresses) = random_state(&mut StdRng::seed_from_u64(seed));
            let found: BTreeSet<String> = summary(&state).resources.keys().cloned().collect();
            assert_eq!(found, addresses, "seed {seed}");
        }
    }

    /// Every random edit (attribute changed, instance removed, output changed or removed) shows
    /// up as exactly that, and nothing else.
    #[test]
    fn changes_are_exactly_the_edits() {
        for seed in 0..300 {
            let mut rng = StdRng::seed_from_u64(seed);
            let (before, _) = random_state(&mut rng);
            let mut after = before.clone();
            let (mut changed, mut removed, mut outputs) =
                (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
            let old = summary(&before);
            let addresses: Vec<String> = old.resources.keys().cloned().collect();
            let resources = after["resources"].as_array_mut().expect("array");
            for resource in resources.iter_mut() {
                let instances = resource["instances"].as_array_mut().expect("array");
                let mut kept = Vec::new();
                for mut instance in instances.drain(..) {
                    let roll = rng.random_range(0..4);
                    if roll == 0 {
                        instance["attributes"]["secret"] = json!("NEW");
                    }
                    if roll != 1 {
                        kept.push(instance);
                    }
                }
                *instances = kept;
            }
            let new = summary(&after);
            for address in &addresses {
                match new.resources.get(address) {
                    None => {
                        removed.insert(address.clone());
                    }
                    Some(r) if r != &old.resources[address] => {
                        changed.insert(address.clone());
                    }
                    Some(_) => {}
                }
            }
            let names: Vec<String> = after["outputs"]
                .as_object()
                .expect("object")
                .keys()
                .cloned()
                .collect();
            for name in names {
                match rng.random_range(0..3) {
                    0 => {
                        after["outputs"]
                            .as_object_mut()
                            .expect("object")
                            .remove(&name);
                        outputs.insert(name);
                    }
                    1 => {
                        after["outputs"][&name]["value"] = json!("other");
                        outputs.insert(name);
                    }
                    _ => {}
                }
            }
            let got = summary(&after).changes_since(Some(&old));
            assert!(got.added.is_empty(), "seed {seed}");
            assert_eq!(
                got.removed.iter().cloned().collect::<BTreeSet<_>>(),
                removed,
                "seed {seed}"
            );
            assert_eq!(
                got.changed.iter().cloned().collect::<BTreeSet<_>>(),
                changed,
                "seed {seed}"
            );
            assert_eq!(
                got.outputs.iter().cloned().collect::<BTreeSet<_>>(),
                outputs,
                "seed {seed}"
            );
            // Reversed, removals are additions.
            let back = old.changes_since(Some(&summary(&after)));
            assert_eq!(
                back.added.iter().cloned().collect::<BTreeSet<_>>(),
                removed,
                "seed {seed}"
            );
            // The first version adds everything.
            let first = old.changes_since(None);
            assert_eq!(first.added, addresses, "seed {seed}");
            assert!(old.changes_since(Some(&old)).is_empty());
        }
    }

    #[test]
    fn non_states_have_no_summary() {
        assert!(Summary::of(b"{\"serial\":1,\"encrypted_data\":\"x\"}").is_none());
        assert!(Summary::of(b"{\"resources\":5}").is_none());
        assert!(Summary::of(b"not json").is_none());
        assert_eq!(Summary::of(b"{}"), Some(Summary::default()));
    }
}
