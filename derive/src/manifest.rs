//! How the crate being compiled names a package, read from its own `Cargo.toml`.
//!
//! `proc-macro-crate` answered this with a whole TOML parser (`toml_edit` and six crates
//! under it, about 8 s of CPU in every cold build of a crate that derives). The answer needs
//! only a manifest's table headers, its keys and one `package = "..."` value, so this reads
//! those: `[package]`'s `name`, and each key of `[dependencies]`, `[dev-dependencies]`,
//! `[build-dependencies]` and their `[target.'...'.*]` forms, written as `key = ...`,
//! `key.workspace = true` or a `[dependencies.key]` table, renamed by `package = "..."`.
//! `[workspace.dependencies]` is not the package's own, and is not read.

/// How a manifest names a package.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// The manifest is the package's own.
    Itself,
    /// A dependency, by the name the crate's code uses (`-` as `_`).
    Name(String),
}

/// How `manifest` (a `Cargo.toml`'s text) names `package`, if it does.
pub(crate) fn find(manifest: &str, package: &str) -> Option<Found> {
    let mut table = String::new();
    let mut own = None;
    // (key, package) of every dependency, in order.
    let mut deps: Vec<(String, String)> = Vec::new();
    for line in manifest.lines().map(strip_comment) {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            table = header
                .trim_matches(|c| c == '[' || c == ']' || c == ' ')
                .to_string();
            if let Some(key) = table_key(&table) {
                deps.push((key.clone(), key));
            }
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if table == "package" && key == "name" {
            own = Some(unquote(value));
        } else if is_dependencies(&table) {
            let name = unquote(key.split('.').next().unwrap_or(key).trim());
            let renamed = package_value(value).unwrap_or_else(|| name.clone());
            deps.push((name, renamed));
        } else if key == "package" && table_key(&table).is_some() {
            if let Some(last) = deps.last_mut() {
                last.1 = unquote(value);
            }
        }
    }
    if own.as_deref() == Some(package) {
        return Some(Found::Itself);
    }
    deps.into_iter()
        .find(|(_, p)| p == package)
        .map(|(key, _)| Found::Name(key.replace('-', "_")))
}

const KINDS: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];

/// `[dependencies]` and its kinds, alone or under `[target.'...']`.
fn is_dependencies(table: &str) -> bool {
    KINDS
        .iter()
        .any(|k| table == *k || (table.starts_with("target.") && table.ends_with(&format!(".{k}"))))
}

/// The key of a `[dependencies.key]` table (or its target form).
fn table_key(table: &str) -> Option<String> {
    let (head, key) = table.rsplit_once('.')?;
    is_dependencies(head).then(|| unquote(key))
}

/// The `package = "..."` of an inline table.
fn package_value(value: &str) -> Option<String> {
    let inner = value.strip_prefix('{')?;
    inner.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == "package").then(|| unquote(v.trim().trim_end_matches('}').trim()))
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
mod tests {
    use super::{find, Found};

    fn name(s: &str) -> Option<Found> {
        Some(Found::Name(s.into()))
    }

    #[test]
    fn a_package_is_itself() {
        let m = "[package]\nname = \"pipewright-kernels\" # the kernels\nversion = \"0.1.0\"\n";
        assert_eq!(find(m, "pipewright-kernels"), Some(Found::Itself));
        assert_eq!(find(m, "pipewright"), None);
    }

    #[test]
    fn each_way_of_writing_a_dependency_is_found() {
        let plain = "[package]\nname = \"user\"\n[dependencies]\npipewright = \"0.1\"\n";
        assert_eq!(find(plain, "pipewright"), name("pipewright"));
        let path = "[dependencies]\npipewright = { path = \"../pw\", default-features = false }";
        assert_eq!(find(path, "pipewright"), name("pipewright"));
        let ws = "[dependencies]\npipewright-kernels.workspace = true\n";
        assert_eq!(find(ws, "pipewright-kernels"), name("pipewright_kernels"));
        let table = "[dependencies.pipewright]\npath = \"x\"\nfeatures = [\n  \"viz\",\n]\n";
        assert_eq!(find(table, "pipewright"), name("pipewright"));
        let dev = "[dev-dependencies]\npipewright-kernels = { path = \"k\" }\n";
        assert_eq!(find(dev, "pipewright-kernels"), name("pipewright_kernels"));
        let target = "[target.'cfg(unix)'.dependencies]\npipewright = \"0.1\"\n";
        assert_eq!(find(target, "pipewright"), name("pipewright"));
    }

    #[test]
    fn a_renamed_dependency_is_found_by_its_new_name() {
        let inline = "[dependencies]\npw = { version = \"0.1\", package = \"pipewright\" }\n";
        assert_eq!(find(inline, "pipewright"), name("pw"));
        let table = "[dependencies.pw]\nversion = \"0.1\"\npackage = \"pipewright\"\n";
        assert_eq!(find(table, "pipewright"), name("pw"));
        // The old name is not a dependency any more.
        assert_eq!(find(inline, "pw"), None);
    }

    #[test]
    fn what_is_not_a_dependency_is_not_found() {
        let m = "[workspace.dependencies]\npipewright-kernels = { path = \"kernels\" }\n\
                 [features]\npipewright = []\n# pipewright = \"0.1\"\n\
                 [dependencies]\nserde = \"1\" # pipewright = \"0.1\"\n";
        assert_eq!(find(m, "pipewright-kernels"), None);
        assert_eq!(find(m, "pipewright"), None);
    }
}
