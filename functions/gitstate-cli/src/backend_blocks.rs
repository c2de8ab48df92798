//! The `backend` and `cloud` blocks of a Terraform configuration directory, in HCL and JSON
//! files alike, as Terraform finds them: read once here for `doctor` (which reports on the http
//! backend's values) and for `run` (whose check keeps Terraform off any other backend).

use std::path::{Path, PathBuf};

use anyhow::Context;
use hcl_edit::Span;
use hcl_edit::expr::Expression;
use hcl_edit::template::Element;

/// The files Terraform and OpenTofu read a configuration from.
pub const SUFFIXES: &[&str] = &[".tf", ".tf.json", ".tofu", ".tofu.json"];

/// One `backend "<kind>"` (or `cloud`, kind `cloud`) block.
pub struct Block {
    pub file: PathBuf,
    /// 1-based line of the block (JSON: of the first mention of its kind).
    pub line: usize,
    pub kind: String,
    /// In an override file (`override.tf`, `*_override.tf`…): it replaces the main block.
    pub is_override: bool,
    pub attributes: Vec<Attribute>,
}

/// An attribute of a block: its literal value (`None`: an expression, or JSON other than a
/// string, number or boolean) and line.
pub struct Attribute {
    pub key: String,
    pub value: Option<String>,
    pub line: usize,
}

impl Block {
    /// `file:line` of the block.
    pub fn place(&self) -> String {
        place_of(&self.file, self.line)
    }

    /// `file:line` of one of its attributes.
    pub fn place_of(&self, attribute: &Attribute) -> String {
        place_of(&self.file, attribute.line)
    }
}

/// `name:line`, the file named as a reader sees it in the directory.
pub fn place_of(file: &Path, line: usize) -> String {
    format!(
        "{}:{line}",
        file.file_name().map_or_else(
            || file.display().to_string(),
            |n| n.to_string_lossy().into()
        )
    )
}

/// The configuration files of `dir`, sorted by name.
pub fn configuration_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            SUFFIXES.iter().any(|s| name.ends_with(s)) && p.is_file()
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The blocks of one configuration file's `text` (JSON for `*.json`, else HCL).
pub fn blocks(file: &Path, text: &str) -> anyhow::Result<Vec<Block>> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let is_override = SUFFIXES
        .iter()
        .any(|s| name == &s[1..] || name.ends_with(&format!("_override{s}")));
    let mut found = if name.ends_with(".json") {
        json_blocks(file, text)?
    } else {
        hcl_blocks(file, text)?
    };
    for block in &mut found {
        block.is_override = is_override;
    }
    Ok(found)
}

/// The 1-based line of byte `offset`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |head| head.matches('\n').count() + 1)
}

fn hcl_blocks(file: &Path, text: &str) -> anyhow::Result<Vec<Block>> {
    let body = hcl_edit::parser::parse_body(text)
        .map_err(|e| anyhow::anyhow!("{}: cannot parse ({e})", file.display()))?;
    let line = |span: Option<std::ops::Range<usize>>| line_of(text, span.map_or(0, |s| s.start));
    let mut found = Vec::new();
    for terraform in body.get_blocks("terraform") {
        for block in terraform.body.blocks() {
            let kind = match block.ident.as_str() {
                "backend" => block
                    .labels
                    .first()
                    .map_or_else(String::new, |l| l.as_str().to_owned()),
                "cloud" => "cloud".to_owned(),
                _ => continue,
            };
            found.push(Block {
                file: file.to_path_buf(),
                line: line(block.span()),
                kind,
                is_override: false,
                attributes: block
                    .body
                    .attributes()
                    .map(|a| Attribute {
                        key: a.key.as_str().to_owned(),
                        value: literal(&a.value),
                        line: line(a.span()),
                    })
                    .collect(),
            });
        }
    }
    Ok(found)
}

/// `{"terraform": {"backend": {"<kind>": {…}}}}`, the blocks possibly as lists. JSON carries no
/// positions: the line is that of the first mention of the name.
fn json_blocks(file: &Path, text: &str) -> anyhow::Result<Vec<Block>> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| anyhow::anyhow!("{}:{}: not valid JSON ({e})", file.display(), e.line()))?;
    let list = |v: &serde_json::Value| match v {
        serde_json::Value::Array(items) => items.clone(),
        serde_json::Value::Null => Vec::new(),
        other => vec![other.clone()],
    };
    let line = |needle: &str| line_of(text, text.find(&format!("\"{needle}\"")).unwrap_or(0));
    let block = |kind: &str, attributes: Vec<Attribute>| Block {
        file: file.to_path_buf(),
        line: line(kind),
        kind: kind.to_owned(),
        is_override: false,
        attributes,
    };
    let mut found = Vec::new();
    for terraform in list(&value["terraform"]) {
        for backends in list(&terraform["backend"]) {
            let Some(map) = backends.as_object() else {
                continue;
            };
            for (kind, bodies) in map {
                let attributes = list(bodies)
                    .iter()
                    .filter_map(|b| b.as_object())
                    .flat_map(|b| b.iter())
                    .map(|(k, v)| Attribute {
                        key: k.clone(),
                        value: match v {
                            serde_json::Value::String(s) => Some(s.clone()),
                            serde_json::Value::Bool(b) => Some(b.to_string()),
                            serde_json::Value::Number(n) => Some(n.to_string()),
                            _ => None,
                        },
                        line: line(k),
                    })
                    .collect();
                found.push(block(kind, attributes));
            }
        }
        if !terraform["cloud"].is_null() {
            found.push(block("cloud", Vec::new()));
        }
    }
    Ok(found)
}

/// The value of a literal HCL expression (a backend block takes no variables).
pub fn literal(expr: &Expression) -> Option<String> {
    match expr {
        Expression::String(s) => Some(s.value().clone()),
        Expression::Bool(b) => Some(b.value().to_string()),
        Expression::Number(n) => Some(n.value().to_string()),
        Expression::StringTemplate(t) => literal_template(t.iter(), None),
        Expression::HeredocTemplate(h) => literal_template(h.template.iter(), h.indent()),
        _ => None,
    }
}

fn literal_template<'a>(
    elements: impl Iterator<Item = &'a Element>,
    indent: Option<usize>,
) -> Option<String> {
    let mut text = String::new();
    for element in elements {
        match element {
            Element::Literal(l) => text.push_str(l.value()),
            _ => return None,
        }
    }
    Some(match indent {
        None => text,
        Some(n) => text
            .split_inclusive('\n')
            .map(|line| {
                let cut = line
                    .char_indices()
                    .take_while(|(i, c)| *i < n && (*c == ' ' || *c == '\t'))
                    .count();
                &line[cut..]
            })
            .collect(),
    })
}
