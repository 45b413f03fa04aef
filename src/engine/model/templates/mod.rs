//! The kustomize directory: every kind's base files and patch templates,
//! loaded and parsed once at start-up.
//!
//! Layout: `<dir>/<kind>/base/**` (plain kustomize, copied verbatim into each
//! overlay) and `<dir>/<kind>/patches/*` and `<dir>/<kind>/resources/*`
//! (Tera templates).
//!
//! Values reach templates only in serialized form. Every `{{ expression }}`
//! of every template, whatever its file name, ends in the `data` filter
//! (appended when the templates load): a string becomes a JSON string
//! literal ([`yaml_scalar`]: a double-quoted scalar to YAML and a string to
//! JSON), a list or an object becomes JSON, so a value can never add keys,
//! documents, lines or patch operations to a rendered file. The `data`
//! filter is the one escaper: Tera's own autoescaping is off, since it
//! escapes a value again wherever Tera evaluates an expression inside
//! another (`default`'s value, a list's items, the sides of `==`), and that
//! value, escaped once already, would be written escaped twice. A
//! template's name must therefore end (in any case) in `.yaml`, `.yml` or
//! `.json`, the two formats that escaping is right for; any other name is
//! refused when the kind folder loads. The `json` filter is the one way to
//! emit a typed scalar (a number or a boolean) or a structure: it
//! serializes the value as JSON, which YAML reads as flow style. Templates
//! that try to bypass this (`| safe`, `json_encode`) are rejected when they
//! are loaded.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use tera::{Context, Tera};

mod base;
mod checks;
mod functions;
#[cfg(test)]
mod literal_tests;

/// An error while loading or rendering templates.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The kustomize directory or a file in it could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A template does not parse, or uses a forbidden construct.
    #[error("template {name} is invalid: {reason}")]
    Invalid {
        /// The template's name (`<kind>/patches/<file>`).
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A template's file name does not say YAML or JSON, the formats its
    /// values are escaped for.
    #[error(
        "template {name} is refused: a template's name must end in .yaml, .yml or .json (any case), the formats its values are escaped for"
    )]
    Format {
        /// The template's name (`<kind>/patches/<file>`).
        name: String,
    },
    /// A kind has no `base/kustomization.yaml`.
    #[error(
        "kustomize directory {dir} has no base for kind {kind} (expected {kind}/base/kustomization.yaml)"
    )]
    MissingBase {
        /// The kustomize directory.
        dir: PathBuf,
        /// The kind folder.
        kind: String,
    },
    /// Two kustomize directories hold a folder of the same name.
    #[error("kind folder {kind} is in both {first} and {second}")]
    Duplicate {
        /// The folder.
        kind: String,
        /// One directory.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
    /// A kustomization of a base names something outside the base.
    #[error(transparent)]
    Base(#[from] base::BaseRefusal),
    /// A template asked for by a kind does not exist.
    #[error("no template named {0}")]
    Unknown(String),
    /// Rendering failed (for example a variable the template needs is missing).
    #[error("rendering {name} failed: {reason}")]
    Render {
        /// The template's name.
        name: String,
        /// Tera's explanation, with its causes.
        reason: String,
    },
}

/// The parsed kustomize directories: per kind folder, its base files and
/// its templates (`patches/`, `resources/`).
#[derive(Debug)]
pub struct KustomizeDir {
    templates: Templates,
    bases: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    roots: BTreeMap<String, PathBuf>,
}

impl Default for KustomizeDir {
    /// No kind folders (an engine that only plans, whose kinds bring
    /// their own).
    fn default() -> Self {
        Self {
            templates: Templates {
                renderer: Renderer::Here(Arc::new(CompiledTemplates { tera: new_tera() })),
                sources: Arc::new(TemplateSources::new(TemplateFlavor::Files, Vec::new())),
            },
            bases: BTreeMap::new(),
            roots: BTreeMap::new(),
        }
    }
}

/// The folders of a kind folder that hold templates.
const TEMPLATE_DIRS: [&str; 2] = ["patches", "resources"];

impl KustomizeDir {
    /// Loads every kind folder under `root`, parsing all templates. A broken
    /// template is an error naming its file.
    pub fn load(root: &Path) -> Result<Self, TemplateError> {
        Self::load_all(std::slice::from_ref(&root.to_path_buf()))
    }

    /// Loads every kind folder under each of `roots` (a kind folder's name
    /// must be unique across them).
    pub fn load_all(roots: &[PathBuf]) -> Result<Self, TemplateError> {
        let mut bases = BTreeMap::new();
        let mut found: BTreeMap<String, PathBuf> = BTreeMap::new();
        let mut templates = Vec::new();
        for root in roots {
            for entry in kind_folders(root)? {
                let kind = entry.file_name().to_string_lossy().into_owned();
                if let Some(other) = found.get(&kind) {
                    return Err(TemplateError::Duplicate {
                        kind,
                        first: other.clone(),
                        second: root.clone(),
                    });
                }
                let base = load_kind(root, &entry.path(), &kind, &mut templates)?;
                bases.insert(kind.clone(), base);
                found.insert(kind, root.clone());
            }
        }
        Ok(Self {
            templates: Templates::compile(TemplateFlavor::Files, templates)?,
            bases,
            roots: found,
        })
    }

    /// Renders this directory's templates in `isolation` from now on
    /// (a kind defined in the cluster: its templates are hostile input).
    pub fn isolate(&mut self, isolation: Arc<dyn Isolation>) {
        self.templates.isolate(isolation);
    }

    /// The kind folders found, with the directory each was found in.
    pub fn kinds(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.roots.iter().map(|(k, r)| (k.as_str(), r.as_path()))
    }

    /// The templates of `kind`, relative to its folder (`patches/x.yaml`).
    pub fn templates_of(&self, kind: &str) -> Vec<String> {
        let prefix = format!("{kind}/");
        self.templates
            .names()
            .filter_map(|n| n.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    /// The base files of `kind` (relative path → content).
    pub fn base(&self, kind: &str) -> Option<&BTreeMap<String, Vec<u8>>> {
        self.bases.get(kind)
    }

    /// Renders the template `name` (e.g. `sample/patches/deployment.yaml`) with `values`.
    pub fn render(&self, name: &str, values: &impl Serialize) -> Result<String, TemplateError> {
        if !self.templates.names().any(|n| n == name) {
            return Err(TemplateError::Unknown(name.to_string()));
        }
        let context = Context::from_serialize(values).map_err(|e| TemplateError::Render {
            name: name.to_string(),
            reason: error_chain(&e),
        })?;
        self.templates.render(name, &context)
    }
}

/// Reads the kind folder `folder` of `root`: its base files, returned, and
/// its templates, added to `templates`.
fn load_kind(
    root: &Path,
    folder: &Path,
    kind: &str,
    templates: &mut Vec<(String, String)>,
) -> Result<BTreeMap<String, Vec<u8>>, TemplateError> {
    let base_dir = folder.join("base");
    if !base_dir.join("kustomization.yaml").is_file() {
        return Err(TemplateError::MissingBase {
            dir: root.to_path_buf(),
            kind: kind.to_string(),
        });
    }
    let mut files = BTreeMap::new();
    collect_files(&base_dir, &base_dir, &mut files)?;
    base::check(kind, &files)?;
    for sub in TEMPLATE_DIRS {
        let dir = folder.join(sub);
        if !dir.is_dir() {
            continue;
        }
        let mut found = BTreeMap::new();
        collect_files(&dir, &dir, &mut found)?;
        for (rel, bytes) in found {
            let name = format!("{kind}/{sub}/{rel}");
            if TemplateFormat::of(&name).is_none() {
                return Err(TemplateError::Format { name });
            }
            let text = String::from_utf8(bytes).map_err(|_| TemplateError::Invalid {
                name: name.clone(),
                reason: "not UTF-8".into(),
            })?;
            check_no_escape_bypass(&name, &text)?;
            templates.push((name, text));
        }
    }
    Ok(files)
}

/// How a set of templates is parsed and rendered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TemplateFlavor {
    /// Template files (`patches/`, `resources/`): every `{{ }}` escaped
    /// as data.
    Files,
    /// Templated strings of a kind file, rendered as plain text.
    Strings,
}

/// A template set, parsed and checked.
#[derive(Debug)]
pub(crate) struct CompiledTemplates {
    tera: Tera,
}

impl CompiledTemplates {
    /// Parses and checks `templates` ((name, text) pairs) as `flavor` says:
    /// the one way every template set is made, in the operator and in a
    /// render worker alike.
    pub(crate) fn compile(
        flavor: TemplateFlavor,
        templates: &[(String, String)],
    ) -> Result<Self, TemplateError> {
        let mut tera = match flavor {
            TemplateFlavor::Files => new_tera(),
            TemplateFlavor::Strings => plain_tera(),
        };
        for (name, text) in templates {
            tera.add_raw_template(name, text)
                .map_err(|e| TemplateError::Invalid {
                    name: name.clone(),
                    reason: error_chain(&e),
                })?;
        }
        checked(&tera)?;
        if flavor == TemplateFlavor::Files {
            for template in tera.templates.values_mut() {
                every_output_as_data(template);
            }
        }
        Ok(Self { tera })
    }

    /// Renders template `name` for `context`, within [`OUTPUT_LIMIT`].
    fn render(&self, name: &str, context: &serde_json::Value) -> Result<String, TemplateError> {
        let context = Context::from_value(context.clone()).map_err(|e| TemplateError::Render {
            name: name.to_string(),
            reason: error_chain(&e),
        })?;
        self.render_context(name, &context)
    }

    /// Renders template `name` for a context made already.
    fn render_context(&self, name: &str, context: &Context) -> Result<String, TemplateError> {
        render_limited(&self.tera, name, context).map_err(|e| TemplateError::Render {
            name: name.to_string(),
            reason: error_chain(&e),
        })
    }
}

/// A template set and where it renders: in this process, or, once
/// isolated, in a render worker (the set parsed here is then dropped: the
/// operator keeps only its text).
#[derive(Debug, Clone)]
pub struct Templates {
    renderer: Renderer,
    /// The templates' text: their names, and what a worker loads.
    sources: Arc<TemplateSources>,
}

/// Where a template set renders.
#[derive(Debug, Clone)]
enum Renderer {
    /// In this process.
    Here(Arc<CompiledTemplates>),
    /// In a render worker.
    Isolated(Arc<dyn Isolation>),
}

impl Templates {
    /// Parses and checks `templates` ((name, text) pairs) as `flavor` says.
    pub fn compile(
        flavor: TemplateFlavor,
        templates: Vec<(String, String)>,
    ) -> Result<Self, TemplateError> {
        TemplateSources::new(flavor, templates).compile()
    }

    /// Parses and checks the templated strings `templates` ((name, text)
    /// pairs) of a kind file, rendered as plain text.
    pub fn strings(templates: Vec<(String, String)>) -> Result<Self, TemplateError> {
        Self::compile(TemplateFlavor::Strings, templates)
    }

    /// Renders in `isolation` from now on.
    pub fn isolate(&mut self, isolation: Arc<dyn Isolation>) {
        self.renderer = Renderer::Isolated(isolation);
    }

    /// The templates' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.sources.templates.iter().map(|(name, _)| name.as_str())
    }

    /// Renders template `name` for `context`, within [`OUTPUT_LIMIT`].
    pub fn render(&self, name: &str, context: &Context) -> Result<String, TemplateError> {
        match &self.renderer {
            Renderer::Here(compiled) => compiled.render_context(name, context),
            Renderer::Isolated(isolation) => {
                isolation.render(&self.sources, name, &context.clone().into_json())
            }
        }
    }

    /// [`Templates::render`] for a context given as JSON (what a render
    /// worker receives).
    pub fn render_json(
        &self,
        name: &str,
        context: &serde_json::Value,
    ) -> Result<String, TemplateError> {
        match &self.renderer {
            Renderer::Here(compiled) => compiled.render(name, context),
            Renderer::Isolated(isolation) => isolation.render(&self.sources, name, context),
        }
    }
}

/// The text of a template set, as a render worker loads it; named by a
/// digest of its contents.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TemplateSources {
    /// sha256 of the flavor and every (name, text), its first 8 bytes.
    pub id: u64,
    /// How it is parsed.
    pub flavor: TemplateFlavor,
    /// (name, text) of every template.
    pub templates: Vec<(String, String)>,
}

impl TemplateSources {
    /// The sources of `templates`.
    pub fn new(flavor: TemplateFlavor, templates: Vec<(String, String)>) -> Self {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        hasher.update([flavor as u8]);
        for (name, text) in &templates {
            for part in [name, text] {
                hasher.update((part.len() as u64).to_le_bytes());
                hasher.update(part.as_bytes());
            }
        }
        let digest = hasher.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Self {
            id: u64::from_le_bytes(first),
            flavor,
            templates,
        }
    }

    /// The set parsed and checked, as its flavor says, rendering in this
    /// process (the operator's own, or a render worker's).
    pub fn compile(self) -> Result<Templates, TemplateError> {
        let compiled = CompiledTemplates::compile(self.flavor, &self.templates)?;
        Ok(Templates {
            renderer: Renderer::Here(Arc::new(compiled)),
            sources: Arc::new(self),
        })
    }
}

/// Renders template sets away from the operator's own process, under
/// limits (the render workers of `engine::run::sandbox`).
pub trait Isolation: Send + Sync + std::fmt::Debug {
    /// Renders template `name` of `set` for `context`.
    fn render(
        &self,
        set: &TemplateSources,
        name: &str,
        context: &serde_json::Value,
    ) -> Result<String, TemplateError>;
}

/// The kind folders (directories) under `root`, sorted.
fn kind_folders(root: &Path) -> Result<Vec<std::fs::DirEntry>, TemplateError> {
    let mut kinds: Vec<_> = std::fs::read_dir(root)
        .map_err(|source| TemplateError::Read {
            path: root.to_path_buf(),
            source,
        })?
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .collect();
    kinds.sort_by_key(|e| e.file_name());
    Ok(kinds)
}

/// The formats a template may be written in; each `{{ }}` value is escaped
/// by [`yaml_scalar`] in both, whose output (a JSON string literal) is a
/// double-quoted scalar in YAML and a string in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateFormat {
    /// `.yaml` or `.yml`.
    Yaml,
    /// `.json`.
    Json,
}

impl TemplateFormat {
    /// The format a template's file name says (case-insensitively), or
    /// `None` for a name that says neither.
    pub fn of(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        if lower.ends_with(".yaml") || lower.ends_with(".yml") {
            Some(Self::Yaml)
        } else if lower.ends_with(".json") {
            Some(Self::Json)
        } else {
            None
        }
    }
}

fn new_tera() -> Tera {
    // No autoescaping: every `{{ }}` ends in `data` (`every_output_as_data`),
    // which escapes it once, whatever the template's name.
    let mut tera = Tera::default();
    tera.autoescape_on(Vec::new());
    tera.register_filter("json", JsonFilter);
    tera.register_filter(DATA_FILTER, DataFilter);
    functions::register(&mut tera);
    tera
}

/// A Tera for templated strings that are data, not files (a kind file's
/// label values, generator literals, status sources): no escaping, the
/// same functions as every template.
fn plain_tera() -> Tera {
    let mut tera = Tera::default();
    functions::register(&mut tera);
    tera
}

/// Refuses, naming the template, what `tera`'s templates may not do
/// (see `checks.rs`): functions not offered, a `throw` of a value,
/// recursion.
fn checked(tera: &Tera) -> Result<(), TemplateError> {
    checks::check(tera).map_err(|(name, refusal)| TemplateError::Invalid {
        name,
        reason: refusal.to_string(),
    })
}

/// The most one template may write, in bytes: more than any object the API
/// server stores.
pub const OUTPUT_LIMIT: usize = 4 << 20;

/// Renders `name` of `tera` into a string of at most [`OUTPUT_LIMIT`] bytes.
fn render_limited(tera: &Tera, name: &str, context: &Context) -> tera::Result<String> {
    let mut out = Limited(Vec::new());
    tera.render_to(name, context, &mut out)?;
    String::from_utf8(out.0).map_err(|e| tera::Error::msg(e.to_string()))
}

/// A buffer that refuses to grow past [`OUTPUT_LIMIT`].
struct Limited(Vec<u8>);

impl std::io::Write for Limited {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > OUTPUT_LIMIT {
            return Err(std::io::Error::other(format!(
                "the output is larger than {} MiB",
                OUTPUT_LIMIT >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The filter every `{{ }}` of a loaded template ends in.
const DATA_FILTER: &str = "data";

/// Appends the `data` filter to every `{{ }}` of `template`: in its body,
/// its macros and its blocks (Tera keeps copies of those apart from the
/// body, for inheritance).
fn every_output_as_data(template: &mut tera::Template) {
    as_data(&mut template.ast);
    for definition in template.macros.values_mut() {
        as_data(&mut definition.body);
    }
    for block in template.blocks.values_mut() {
        as_data(&mut block.body);
    }
    for definitions in template.blocks_definitions.values_mut() {
        for (_, block) in definitions {
            as_data(&mut block.body);
        }
    }
}

fn as_data(nodes: &mut [tera::ast::Node]) {
    use tera::ast::Node;
    for node in nodes {
        match node {
            Node::VariableBlock(_, expr) => append_data(expr),
            Node::MacroDefinition(_, definition, _) => as_data(&mut definition.body),
            Node::FilterSection(_, section, _) => as_data(&mut section.body),
            Node::Block(_, block, _) => as_data(&mut block.body),
            Node::Forloop(_, lp, _) => {
                as_data(&mut lp.body);
                if let Some(empty) = &mut lp.empty_body {
                    as_data(empty);
                }
            }
            Node::If(branches, _) => {
                for (_, _, body) in &mut branches.conditions {
                    as_data(body);
                }
                if let Some((_, body)) = &mut branches.otherwise {
                    as_data(body);
                }
            }
            _ => {}
        }
    }
}

/// Ends `expr` in the `data` filter, unless it already ends in `json` (or
/// `data`), is a macro call as it is (whose own `{{ }}` are data) or is
/// negated (a boolean: Tera negates after the filters). A macro call a
/// filter rewrites is data again: the filter may have undone its escaping.
fn append_data(expr: &mut tera::ast::Expr) {
    let serialized = expr
        .filters
        .last()
        .is_some_and(|f| f.name == "json" || f.name == DATA_FILTER);
    let bare_macro =
        matches!(expr.val, tera::ast::ExprVal::MacroCall(_)) && expr.filters.is_empty();
    if serialized || expr.negated || bare_macro {
        return;
    }
    expr.filters.push(tera::ast::FunctionCall {
        name: DATA_FILTER.to_string(),
        args: HashMap::new(),
    });
}

/// Rejects templates that would emit a value without serializing it.
fn check_no_escape_bypass(name: &str, text: &str) -> Result<(), TemplateError> {
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    // A filter section rewrites what its `{{ }}` wrote, after escaping.
    let forbidden = [
        "|safe",
        "json_encode",
        "{%raw%}",
        "autoescape",
        "{%filter",
        "{%-filter",
    ];
    for forbidden in forbidden {
        if compact.contains(forbidden) {
            return Err(TemplateError::Invalid {
                name: name.to_string(),
                reason: format!(
                    "uses `{forbidden}`; values must go through the default escaping or the `json` filter"
                ),
            });
        }
    }
    Ok(())
}

fn collect_files(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, Vec<u8>>,
) -> Result<(), TemplateError> {
    let entries = std::fs::read_dir(dir).map_err(|source| TemplateError::Read {
        path: dir.to_path_buf(),
        source,
    })?;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            collect_files(root, &path, out)?;
        } else {
            let bytes = std::fs::read(&path).map_err(|source| TemplateError::Read {
                path: path.clone(),
                source,
            })?;
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            out.insert(rel, bytes);
        }
    }
    Ok(())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        msg.push_str(": ");
        msg.push_str(&cause.to_string());
        source = cause.source();
    }
    msg
}

/// Serializes any string as a YAML double-quoted scalar, which is also a
/// JSON string literal: the escaping of both template formats.
///
/// JSON string syntax is a subset of YAML's double-quoted style; on top of
/// serde_json's escaping, characters YAML does not allow unescaped in a stream
/// (DEL, the C1 controls, the byte-order mark, lone line separators) are
/// written as `\uXXXX` (a JSON escape too) so that any input yields a valid,
/// one-line scalar in either format.
pub fn yaml_scalar(value: &str) -> String {
    let json = serde_json::Value::String(value.to_string()).to_string();
    escape_non_printable(&json)
}

fn escape_non_printable(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        let code = c as u32;
        let needs_escape = code == 0x7f
            || (0x80..=0x9f).contains(&code)
            || code == 0xfeff
            || code == 0x2028
            || code == 0x2029
            || (0xfffe..=0xffff).contains(&code);
        if needs_escape {
            out.push_str(&format!("\\u{code:04x}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// The end of every `{{ }}`: a string as [`yaml_scalar`], a list or an
/// object as JSON (valid YAML flow style); numbers, booleans and null as
/// Tera prints them.
struct DataFilter;

impl tera::Filter for DataFilter {
    fn filter(
        &self,
        value: &tera::Value,
        _args: &HashMap<String, tera::Value>,
    ) -> tera::Result<tera::Value> {
        use tera::Value;
        let text = match value {
            Value::String(s) => yaml_scalar(s),
            Value::Null => String::new(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => i.to_string(),
                (None, Some(u), _) => u.to_string(),
                (None, None, Some(f)) => f.to_string(),
                (None, None, None) => n.to_string(),
            },
            Value::Array(_) | Value::Object(_) => {
                escape_non_printable(&serde_json::to_string(value).map_err(tera::Error::json)?)
            }
        };
        Ok(Value::String(text))
    }

    fn is_safe(&self) -> bool {
        true
    }
}

/// `{{ value | json }}`: the value serialized as JSON (valid YAML flow style).
struct JsonFilter;

impl tera::Filter for JsonFilter {
    fn filter(
        &self,
        value: &tera::Value,
        _args: &HashMap<String, tera::Value>,
    ) -> tera::Result<tera::Value> {
        let json = serde_json::to_string(value).map_err(tera::Error::json)?;
        Ok(tera::Value::String(escape_non_printable(&json)))
    }

    fn is_safe(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An isolation that answers with the set's id and the template's name.
    #[derive(Debug)]
    struct Echo;

    impl Isolation for Echo {
        fn render(
            &self,
            set: &TemplateSources,
            name: &str,
            _: &serde_json::Value,
        ) -> Result<String, TemplateError> {
            Ok(format!("{} {name}", set.id))
        }
    }

    #[test]
    fn an_isolated_set_keeps_its_names_and_renders_only_in_its_worker() {
        let texts = vec![("a".to_string(), "{{ x }}".to_string())];
        let mut templates = Templates::compile(TemplateFlavor::Strings, texts).unwrap();
        let context = Context::from_value(json!({"x": 1})).unwrap();
        assert_eq!(templates.render("a", &context).unwrap(), "1");
        templates.isolate(Arc::new(Echo));
        assert!(
            matches!(templates.renderer, Renderer::Isolated(_)),
            "the parsed set is dropped"
        );
        assert_eq!(templates.names().collect::<Vec<_>>(), ["a"]);
        let id = templates.sources.id;
        assert_eq!(templates.render("a", &context).unwrap(), format!("{id} a"));
    }

    fn dir_with(template: &str) -> tempfile::TempDir {
        dir_with_file("patches/p.yaml", template)
    }

    /// A kustomize directory of one kind `k` holding the template `file`.
    fn dir_with_file(file: &str, template: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let kind = dir.path().join("k");
        std::fs::create_dir_all(kind.join("base")).unwrap();
        let path = kind.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(kind.join("base/kustomization.yaml"), "resources: []\n").unwrap();
        std::fs::write(path, template).unwrap();
        dir
    }

    /// Breaks out of a JSON string into a second patch operation when pasted raw.
    const JSON_INJECTION: &str = r#""x"}, {"op":"add","path":"/data/injected","value":"yes""#;

    fn hostile() -> Vec<String> {
        vec![
            JSON_INJECTION.into(),
            "a: b\nkind: Secret\n---\nx: y".into(),
            "\\\" ] } {{ x }}".into(),
            "tab\t nul\u{0} del\u{7f} nel\u{85} bom\u{feff} ls\u{2028} \u{ffff} \u{1F600}".into(),
        ]
    }

    #[test]
    fn a_json_template_gets_one_json_string_per_value() {
        let template = r#"[{"op": "replace", "path": "/data/v", "value": {{ v }}}]"#;
        let dir = dir_with_file("patches/p.json", template);
        let k = KustomizeDir::load(dir.path()).unwrap();
        for value in hostile() {
            let out = k
                .render("k/patches/p.json", &json!({ "v": value }))
                .unwrap();
            let parsed: serde_json::Value =
                serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
            assert_eq!(
                parsed,
                json!([{"op": "replace", "path": "/data/v", "value": value}]),
                "{out}"
            );
        }
    }

    #[test]
    fn the_escaper_writes_a_string_both_json_and_yaml_read_back() {
        for value in hostile() {
            let scalar = yaml_scalar(&value);
            let from_json: String = serde_json::from_str(&scalar).unwrap();
            let from_yaml: String = serde_saphyr::from_str(&scalar).unwrap();
            assert_eq!(from_json, value);
            assert_eq!(from_yaml, value);
            assert!(!scalar.contains('\n'), "one line: {scalar}");
        }
    }

    #[test]
    fn every_template_name_is_escaped_whatever_its_case() {
        for file in [
            "patches/P.YAML",
            "patches/p.Yml",
            "patches/sub/p.yaml",
            "resources/r.JSON",
        ] {
            let dir = dir_with_file(file, "v: {{ v }}\n");
            let k = KustomizeDir::load(dir.path()).unwrap();
            let out = k
                .render(&format!("k/{file}"), &json!({ "v": "a\nb: c" }))
                .unwrap();
            assert_eq!(out, "v: \"a\\nb: c\"\n", "{file}");
        }
    }

    #[test]
    fn a_template_named_neither_yaml_nor_json_is_refused_naming_it() {
        for file in [
            "patches/p.yaml.tpl",
            "patches/p.txt",
            "patches/p",
            "resources/r.j2",
            "patches/.gitkeep",
        ] {
            let dir = dir_with_file(file, "v: {{ v }}\n");
            let err = KustomizeDir::load(dir.path()).unwrap_err();
            assert!(matches!(err, TemplateError::Format { .. }), "{file}: {err}");
            let message = err.to_string();
            assert!(message.contains(&format!("k/{file}")), "{message}");
            assert!(message.contains(".json"), "{message}");
        }
    }

    #[test]
    fn a_list_or_an_object_is_written_as_json() {
        let dir = dir_with(
            "l: {{ l }}\no: {{ o }}\ni: {{ l.0 }}\nn: {{ n }}\nf: {{ f }}\nb: {{ not b }}\nz: {{ z }}\n",
        );
        let k = KustomizeDir::load(dir.path()).unwrap();
        let injection = "a]\ninjected: yes\nx: [b";
        let values = json!({"l": [injection, 1], "o": {"k": injection}, "n": 3, "f": 1.5, "b": false, "z": null});
        let out = k.render("k/patches/p.yaml", &values).unwrap();
        let parsed: serde_json::Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(
            parsed,
            json!({"l": [injection, 1], "o": {"k": injection}, "i": injection, "n": 3, "f": 1.5, "b": true, "z": null}),
            "{out}"
        );
    }

    #[test]
    fn values_in_loops_conditions_and_macros_are_data() {
        let template = "{% macro item(v) %}- {{ v }}{% endmacro item %}\
            {% for v in l %}{{ self::item(v=v) }}\n{% endfor %}\
            {% if true %}- {{ l.0 }}\n{% else %}- {{ l.1 }}\n{% endif %}";
        let dir = dir_with(template);
        let k = KustomizeDir::load(dir.path()).unwrap();
        let values = json!({"l": ["a\n- b", "c: d"]});
        let out = k.render("k/patches/p.yaml", &values).unwrap();
        let parsed: Vec<String> = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(parsed, ["a\n- b", "c: d", "a\n- b"], "{out}");
    }

    #[test]
    fn a_condition_tests_a_strings_value_not_its_escaped_text() {
        let template = "- {% if s %}T{% else %}F{% endif %}\n\
            - {% if not s %}T{% else %}F{% endif %}\n\
            - {% if s and t %}T{% else %}F{% endif %}\n\
            - {% if s or t %}T{% else %}F{% endif %}\n\
            - {% if s ~ '' %}T{% else %}F{% endif %}\n\
            - {% if l | first %}T{% elif t %}E{% else %}F{% endif %}\n";
        let dir = dir_with(template);
        let k = KustomizeDir::load(dir.path()).unwrap();
        let render = |values: serde_json::Value| -> Vec<String> {
            let out = k.render("k/patches/p.yaml", &values).unwrap();
            serde_saphyr::from_str(&out).unwrap()
        };
        let empty = render(json!({"s": "", "t": "x", "l": [""]}));
        assert_eq!(empty, ["F", "T", "F", "T", "F", "E"]);
        let full = render(json!({"s": "a", "t": "", "l": ["a"]}));
        assert_eq!(full, ["T", "F", "F", "T", "T", "T"]);
    }

    #[test]
    fn a_filter_section_is_rejected() {
        let dir = dir_with("{% filter replace(from='\"', to='') %}v: {{ v }}{% endfilter %}\n");
        let err = KustomizeDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("{%filter"), "{err}");
    }

    #[test]
    fn template_formats_follow_the_name_in_any_case() {
        assert_eq!(TemplateFormat::of("a.yaml"), Some(TemplateFormat::Yaml));
        assert_eq!(TemplateFormat::of("A.YML"), Some(TemplateFormat::Yaml));
        assert_eq!(TemplateFormat::of("a.Json"), Some(TemplateFormat::Json));
        assert_eq!(TemplateFormat::of("a.yaml.tpl"), None);
        assert_eq!(TemplateFormat::of("json"), None);
    }

    #[test]
    fn default_escaping_quotes_every_value() {
        let dir = dir_with("name: {{ name }}\ncount: {{ count | json }}\n");
        let k = KustomizeDir::load(dir.path()).unwrap();
        let out = k
            .render("k/patches/p.yaml", &json!({"name": "a: b", "count": 3}))
            .unwrap();
        assert_eq!(out, "name: \"a: b\"\ncount: 3\n");
    }

    #[test]
    fn broken_template_is_an_error_naming_the_file() {
        let dir = dir_with("name: {{ name \n");
        let err = KustomizeDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("k/patches/p.yaml"), "{err}");
    }

    #[test]
    fn safe_filter_is_rejected() {
        let dir = dir_with("name: {{ name | safe }}\n");
        let err = KustomizeDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("safe"), "{err}");
    }

    #[test]
    fn missing_base_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("x/patches")).unwrap();
        let err = KustomizeDir::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("no base for kind x"), "{err}");
    }

    #[test]
    fn scalar_escapes_yaml_hostile_characters() {
        assert_eq!(yaml_scalar("a\nb"), "\"a\\nb\"");
        assert_eq!(
            yaml_scalar("\u{7f}\u{85}\u{feff}"),
            "\"\\u007f\\u0085\\ufeff\""
        );
    }
}
