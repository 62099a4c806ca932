//! No crate of Countersign has an import cycle between its modules (`make layers`, and part of
//! `make test`).

#![allow(clippy::expect_used, clippy::unwrap_used)] // a test: failing loudly is the point.

use std::path::Path;

use countersign_layers::{expand, read_crate};

/// The crate roots checked.
const ROOTS: [&str; 4] = [
    "core/src/lib.rs",
    "app/src/lib.rs",
    "server/src/lib.rs",
    "server/src/main.rs",
];

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn relative(p: &Path) -> String {
    let canonical = p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
    let root = repo().canonicalize().expect("the repository");
    canonical
        .strip_prefix(&root)
        .unwrap_or(&canonical)
        .display()
        .to_string()
}

/// Every cycle as (the files in it, the edges that close it), repository-relative.
fn cycles() -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for root in ROOTS {
        let graph = read_crate(&repo().join(root)).expect("the crate reads");
        assert!(
            graph.files.len() > 1 || root.ends_with("main.rs"),
            "{root}: no modules found"
        );
        for cycle in graph.cycles() {
            let files = cycle.iter().map(|f| relative(f)).collect();
            let edges = graph
                .explain(&cycle)
                .into_iter()
                .map(|e| {
                    let (a, b) = e.split_once(" -> ").unwrap_or((&e, ""));
                    format!("{} -> {}", relative(Path::new(a)), relative(Path::new(b)))
                })
                .collect();
            out.push((files, edges));
        }
    }
    out
}

fn report(cycles: &[(Vec<String>, Vec<String>)]) -> String {
    cycles
        .iter()
        .map(|(files, edges)| {
            format!(
                "a cycle of {} modules:\n  {}",
                files.len(),
                edges.join("\n  ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// `make layers` and `make test`: no import cycle between the modules of any crate.
#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let found = cycles();
    assert!(found.is_empty(), "\n{}\n", report(&found));
}

#[test]
fn the_checker_sees_a_cycle_through_use_trees_super_and_re_exports() {
    let dir = std::env::temp_dir().join(format!("layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::create_dir_all(src.join("c")).unwrap();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\nmod d {\n    mod e;\n}\npub use a::Thing;\n",
    )
    .unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod inner;\npub use inner::Thing;\n").unwrap();
    // A flat file's children (c.rs + c/deep.rs) and an inline module's (d/e.rs) are read.
    std::fs::write(src.join("c.rs"), "mod deep;\n").unwrap();
    std::fs::write(
        src.join("c/deep.rs"),
        "#[cfg(all(test, feature = \"x\"))]\nmod tests { use crate::b::helper; }\n",
    )
    .unwrap();
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/e.rs"), "\n").unwrap();
    // a::inner names b (through a use tree); b names a's re-export of inner's Thing.
    std::fs::write(
        src.join("a/inner.rs"),
        "use crate::{b::{self, helper}};\npub struct Thing;\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "// crate::a::nothing in a comment\npub fn helper() -> super::Thing { super::Thing }\n",
    )
    .unwrap();
    let graph = read_crate(&src.join("lib.rs")).unwrap();
    for module in ["c::deep", "d::e"] {
        let path: Vec<String> = module.split("::").map(str::to_string).collect();
        assert!(
            graph.files.contains_key(&path),
            "{module} read: {:?}",
            graph.files.keys()
        );
    }
    let deep = vec!["c".to_string(), "deep".to_string()];
    assert!(
        graph.edges.get(&deep).is_none_or(|e| e.is_empty()),
        "a test module is no dependency"
    );
    let cycles = graph.cycles();
    assert_eq!(cycles.len(), 1, "{:?}", graph.edges);
    assert_eq!(cycles[0].len(), 2, "{cycles:?}");
    assert!(
        cycles[0].iter().any(|f| f.ends_with("a/inner.rs")),
        "{cycles:?}"
    );
    // Without b's use of Thing there is none (a re-export alone is no dependency), and a
    // test module's use is not the module's.
    std::fs::write(
        src.join("b.rs"),
        "pub fn helper() {}\n#[cfg(test)]\nmod tests {\n    use crate::a::Thing;\n}\n",
    )
    .unwrap();
    assert!(read_crate(&src.join("lib.rs")).unwrap().cycles().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn use_trees_expand_with_aliases_and_self() {
    let paths = expand("crate::{a::{self, b as c}, d::*}");
    let shown: Vec<String> = paths
        .iter()
        .map(|(p, a)| {
            format!(
                "{}{}",
                p.join("::"),
                a.as_ref().map(|a| format!(" as {a}")).unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(shown, ["crate::a", "crate::a::b as c", "crate::d::*"]);
}

/// `make layers` prints each crate's floors (the picture docs/architecture.md shows).
#[test]
#[ignore = "prints the floors; `make layers` runs it"]
fn print_the_floors() {
    for root in ROOTS {
        let graph = read_crate(&repo().join(root)).expect("the crate reads");
        println!("{root}, from the top floor down:");
        for (n, floor) in graph.floors().iter().enumerate().rev() {
            let names: Vec<String> = floor
                .iter()
                .map(|m| {
                    if m.is_empty() {
                        "(root)".to_string()
                    } else {
                        m.join("::")
                    }
                })
                .collect();
            println!("  {n:>2}  {}", names.join("  "));
        }
    }
}
