//! The import graph between the top-level modules of a crate, read from
//! its source as text: module `a` imports `b` when its code (comments and
//! `#[cfg(test)]` items left out) names `crate::b`. Modules layer
//! downward (docs/architecture.md): a circle among them is a fault, which
//! the test below looks for in every product crate. The shim keeps a
//! stricter test of its own (the documented order of its layers).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level module -> the top-level modules it imports.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The graph of the crate whose `src` directory is `src`.
pub fn read(src: &Path) -> std::io::Result<Graph> {
    let mut code: BTreeMap<String, String> = BTreeMap::new();
    collect(src, src, &mut code)?;
    let modules: BTreeSet<String> = code.keys().cloned().collect();
    let mut graph = Graph::new();
    for (module, text) in &code {
        let uses = graph.entry(module.clone()).or_default();
        for name in crate_paths(&product_code(text)) {
            if name != *module && modules.contains(&name) {
                uses.insert(name);
            }
        }
    }
    Ok(graph)
}

/// The circles of `graph`, each as the modules on it, smallest first.
pub fn circles(graph: &Graph) -> Vec<Vec<String>> {
    let mut found = BTreeSet::new();
    for start in graph.keys() {
        let mut stack = vec![start.clone()];
        walk(graph, &mut stack, &mut found);
    }
    let mut out: Vec<Vec<String>> = found.into_iter().collect();
    out.sort_by_key(Vec::len);
    out
}

fn walk(graph: &Graph, stack: &mut Vec<String>, found: &mut BTreeSet<Vec<String>>) {
    let Some(next) = graph.get(stack.last().expect("never empty")) else {
        return;
    };
    for n in next {
        if let Some(i) = stack.iter().position(|m| m == n) {
            let mut circle = stack[i..].to_vec();
            circle.sort();
            found.insert(circle);
        } else if stack.len() < graph.len() {
            stack.push(n.clone());
            walk(graph, stack, found);
            stack.pop();
        }
    }
}

/// Every `.rs` file below `dir`, by the top-level module it belongs to
/// (`lib.rs`/`main.rs` are the crate root, `bin/` and test files are not
/// modules of the library).
fn collect(src: &Path, dir: &Path, code: &mut BTreeMap<String, String>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let rel = path.strip_prefix(src).unwrap_or(&path);
        let first = rel
            .components()
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        if first == "bin" || first == "tests" || first == "tests.rs" {
            continue;
        }
        if path.is_dir() {
            collect(src, &path, code)?;
        } else if path.extension().is_some_and(|e| e == "rs") && !is_test_file(&path) {
            let module = first.trim_end_matches(".rs").to_string();
            if matches!(module.as_str(), "lib" | "main") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            code.entry(module).or_default().push_str(&text);
        }
    }
    Ok(())
}

fn is_test_file(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "tests.rs" || n == "test_support.rs")
}

/// `text` without comments and without the items after a `#[cfg(test)]`
/// (test modules sit at the end of a file by this project's habit).
fn product_code(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or("");
    before_tests
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of every `crate::x` path in `code`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `gpuslice_crate::`, `$crate::`
        }
        let rest = &code[i + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)]) -> Graph {
        let mut g = Graph::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    }

    #[test]
    fn a_circle_is_found_and_a_layering_is_not_one() {
        assert!(circles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
        assert_eq!(
            circles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])),
            vec![vec!["a".to_string(), "b".into(), "c".into()]]
        );
    }

    #[test]
    fn comments_tests_and_other_crates_are_not_imports() {
        let code = product_code(
            "use crate::a::X;\n// crate::b\n/// [`crate::c`]\nfn f() { gpuslice_crate::d(); crate::e::f(); }\n#[cfg(test)]\nmod tests { use crate::g; }\n",
        );
        let names: Vec<String> = crate_paths(&code).into_iter().collect();
        assert_eq!(names, ["a", "e"]);
    }

    /// Every crate under crates/ (docs/architecture.md: modules layer
    /// downward, no loops).
    #[test]
    fn no_product_crate_has_an_import_circle() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates");
        let mut faults = Vec::new();
        let mut read_any = 0;
        for entry in std::fs::read_dir(&crates).unwrap() {
            let src = entry.unwrap().path().join("src");
            if !src.is_dir() {
                continue;
            }
            let g = read(&src).unwrap();
            read_any += g.len();
            for c in circles(&g) {
                faults.push(format!("{}: {}", src.display(), c.join(" <-> ")));
            }
        }
        assert!(
            read_any > 50,
            "read {read_any} modules below {}",
            crates.display()
        );
        assert!(faults.is_empty(), "import circles:\n{}", faults.join("\n"));
    }
}
