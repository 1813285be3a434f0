//! How the crate being compiled names a package, read from its own `Cargo.toml`.
//!
//! `proc-macro-crate` answered this with a whole TOML parser (`toml_edit` and six crates
//! under it, about 8 s of CPU in every cold build of a crate that derives). The answer needs
//! only a manifest's table headers, its keys and one `package = "..."` value, so this reads
//! those, as proc-macro-crate did: `[package]`'s `name`, and each key of `[dependencies]` and
//! `[dev-dependencies]` and their `[target.'...'.*]` forms, written as `key = ...`,
//! `key.workspace = true` or a `[dependencies.key]` table, renamed by `package = "..."` (or
//! `key.package = "..."`). A key inherited from the workspace takes its `package` from the
//! workspace's `[workspace.dependencies]`. Not read: a multi-line `"""` string whose lines look
//! like keys, and multi-line inline tables.

/// How a manifest names a package.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The manifest is the package's own.
    Itself,
    /// A dependency, by the name the crate's code uses (`-` as `_`).
    Name(String),
}

/// One dependency as a manifest writes it.
struct Entry {
    key: String,
    /// `package = "..."`, when renamed.
    package: Option<String>,
    /// `workspace = true`: the rest is in the workspace's manifest.
    inherited: bool,
}

/// A manifest's package name and its dependencies, each as `(key, package)`.
pub(crate) struct Manifest {
    own: Option<String>,
    deps: Vec<(String, String)>,
}

impl Manifest {
    /// `manifest` (a `Cargo.toml`'s text) read once. `workspace` gives the workspace root's
    /// manifest, read only when a dependency inherits its package from it.
    pub(crate) fn read(manifest: &str, workspace: impl FnOnce() -> Option<String>) -> Self {
        let (own, entries) = scan(manifest, is_dependencies);
        let shared = if entries.iter().any(|e| e.inherited && e.package.is_none()) {
            scan(&workspace().unwrap_or_default(), |t| {
                t == "workspace.dependencies"
            })
            .1
        } else {
            Vec::new()
        };
        let deps = entries
            .into_iter()
            .map(|e| {
                let inherited = || shared.iter().find(|w| w.key == e.key)?.package.clone();
                let package = match (e.package, e.inherited) {
                    (Some(p), _) => Some(p),
                    (None, true) => inherited(),
                    (None, false) => None,
                };
                (e.key.clone(), package.unwrap_or(e.key))
            })
            .collect();
        Manifest { own, deps }
    }

    /// How the manifest names `package`, if it does.
    pub(crate) fn find(&self, package: &str) -> Option<Found> {
        if self.own.as_deref() == Some(package) {
            return Some(Found::Itself);
        }
        let (key, _) = self.deps.iter().find(|(_, p)| p == package)?;
        Some(Found::Name(key.replace('-', "_")))
    }
}

/// The manifest's `[package]` name, and the dependencies of the tables `deps` accepts.
fn scan(manifest: &str, deps: fn(&str) -> bool) -> (Option<String>, Vec<Entry>) {
    let (mut table, mut own, mut entries) = (String::new(), None, Vec::<Entry>::new());
    for line in manifest.lines().map(strip_comment) {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            table = header
                .trim_matches(|c| c == '[' || c == ']' || c == ' ')
                .to_string();
            if let Some(key) = table_key(&table, deps) {
                entries.push(entry(key));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if table == "package" && key == "name" {
            own = Some(unquote(value));
        } else if deps(&table) {
            let mut parts = key.split('.');
            let name = unquote(parts.next().unwrap_or(key));
            let field = parts.next().map(unquote);
            if !matches!(entries.last(), Some(e) if e.key == name) {
                entries.push(entry(name));
            }
            if let Some(last) = entries.last_mut() {
                set(last, field.as_deref(), value);
            }
        } else if let (Some(last), true) = (entries.last_mut(), table_key(&table, deps).is_some()) {
            set(last, Some(key), value);
        }
    }
    (own, entries)
}

fn entry(key: String) -> Entry {
    Entry {
        key,
        package: None,
        inherited: false,
    }
}

/// One `field = value` of a dependency (`None`: the dependency's whole value).
fn set(e: &mut Entry, field: Option<&str>, value: &str) {
    match field {
        None => {
            e.package = e.package.take().or_else(|| inline(value, "package"));
            e.inherited |= inline(value, "workspace").as_deref() == Some("true");
        }
        Some("package") => e.package = Some(unquote(value)),
        Some("workspace") => e.inherited |= value == "true",
        Some(_) => {}
    }
}

/// `[dependencies]` and `[dev-dependencies]`, alone or under `[target.'...']`.
fn is_dependencies(table: &str) -> bool {
    ["dependencies", "dev-dependencies"]
        .iter()
        .any(|k| table == *k || (table.starts_with("target.") && table.ends_with(&format!(".{k}"))))
}

/// The key of a `[dependencies.key]` table (or its target form).
fn table_key(table: &str, deps: fn(&str) -> bool) -> Option<String> {
    let (head, key) = table.rsplit_once('.')?;
    deps(head).then(|| unquote(key))
}

/// The `field = ...` of an inline table.
fn inline(value: &str, field: &str) -> Option<String> {
    let inner = value.strip_prefix('{')?;
    inner.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == field).then(|| unquote(v.trim().trim_end_matches('}').trim()))
    })
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches(|c| c == '"' || c == '\'').to_string()
}

/// The line without its comment (a `#` outside quotes).
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') => return &line[..i],
            _ => {}
        }
    }
    line
}

#[cfg(test)]
mod tests;
