use super::{Found, Manifest};

fn find(m: &str, package: &str) -> Option<Found> {
    Manifest::read(m, || None).find(package)
}

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
    let quoted = "[dependencies]\n\"pipewright\" = \"0.1\"\n";
    assert_eq!(find(quoted, "pipewright"), name("pipewright"));
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
    let dotted = "[dependencies]\npw.version = \"0.1\"\npw.package = \"pipewright\"\n";
    assert_eq!(find(dotted, "pipewright"), name("pw"));
    // The old name is not a dependency any more.
    assert_eq!(find(inline, "pw"), None);
}

#[test]
fn an_inherited_rename_is_read_from_the_workspace() {
    let member = "[package]\nname = \"user\"\n[dependencies]\npw = { workspace = true }\n";
    let root = "[workspace]\nmembers = [\"user\"]\n[workspace.dependencies]\n\
                pw = { path = \"../pw\", package = \"pipewright\" }\n";
    let found = Manifest::read(member, || Some(root.into())).find("pipewright");
    assert_eq!(found, name("pw"));
    // Without the workspace's manifest, the key is all there is.
    assert_eq!(find(member, "pipewright"), None);
    assert_eq!(find(member, "pw"), name("pw"));
}

#[test]
fn what_is_not_a_dependency_is_not_found() {
    let m = "[workspace.dependencies]\npipewright-kernels = { path = \"kernels\" }\n\
             [build-dependencies]\npipewright-kernels = \"0.1\"\n\
             [features]\npipewright = []\n# pipewright = \"0.1\"\n\
             [dependencies]\nserde = \"1\" # pipewright = \"0.1\"\n";
    assert_eq!(find(m, "pipewright-kernels"), None);
    assert_eq!(find(m, "pipewright"), None);
}
