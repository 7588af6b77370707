//! The shim's modules are layered downward: no `crate::<module>` import
//! loop among src/*.rs (docs/architecture.md, "The shim's layers"). A
//! loop makes every module in it depend on all the others; this test
//! names the first loop it finds.

use std::collections::BTreeMap;
use std::path::Path;

/// `crate::<module>` references in `code` (comment lines skipped: a doc
/// link is no dependency), including `crate::{a, b::c}` groups.
fn references(code: &str, modules: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for line in code.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                group[..end].split(',').collect()
            } else {
                vec![rest]
            };
            for n in names {
                let id: String = n
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if modules.contains(&id) && !out.contains(&id) {
                    out.push(id);
                }
            }
        }
    }
    out
}

/// The module graph of the `src` directory: file stem → modules it uses.
fn graph(src: &Path) -> BTreeMap<String, Vec<String>> {
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(src).expect("read the shim's src/") {
        let p = e.expect("list src/").path();
        if p.extension().is_some_and(|x| x == "rs") {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            if stem != "lib" {
                files.insert(stem, std::fs::read_to_string(&p).expect("read a module"));
            }
        }
    }
    let modules: Vec<String> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(m, code)| {
            let mut deps = references(code, &modules);
            deps.retain(|d| d != m);
            (m.clone(), deps)
        })
        .collect()
}

/// One import loop of `g` (its modules in order, the first repeated at
/// the end), if any.
fn find_cycle(g: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        m: &str,
        g: &BTreeMap<String, Vec<String>>,
        mark: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        mark.insert(m.to_string(), Mark::Open);
        path.push(m.to_string());
        for d in &g[m] {
            match mark[d.as_str()] {
                Mark::Open => {
                    let from = path.iter().position(|p| p == d).unwrap();
                    let mut cycle = path[from..].to_vec();
                    cycle.push(d.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(d, g, mark, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        mark.insert(m.to_string(), Mark::Done);
        None
    }
    let mut mark: BTreeMap<String, Mark> = g.keys().map(|k| (k.clone(), Mark::New)).collect();
    for m in g.keys() {
        if mark[m.as_str()] == Mark::New {
            if let Some(c) = visit(m, g, &mut mark, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_shim_has_no_import_loop() {
    let g = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(g.len() >= 10, "found only {} modules in src/", g.len());
    if let Some(cycle) = find_cycle(&g) {
        panic!(
            "the shim's modules import each other in a loop: {}\n(layer them downward; see docs/architecture.md)",
            cycle.join(" -> ")
        );
    }
}

/// The checker itself finds a loop, a grouped import and skips comments.
#[test]
fn the_checker_sees_loops() {
    let modules: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    assert_eq!(
        references("use crate::{a, b::X};\n/// [`crate::c`]\n", &modules),
        ["a", "b"]
    );
    let g: BTreeMap<String, Vec<String>> = [
        ("a".to_string(), vec!["b".to_string()]),
        ("b".to_string(), vec!["c".to_string()]),
        ("c".to_string(), vec!["a".to_string()]),
    ]
    .into_iter()
    .collect();
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
    let mut g = g;
    g.insert("c".to_string(), vec![]);
    assert_eq!(find_cycle(&g), None);
}

/// The shim's layers, bottom to top, as docs/architecture.md ("The shim's
/// layers") lists them: a module imports only from layers below its own.
const LAYERS: &[&[&str]] = &[
    &["cuda", "config", "dl"],
    &["sys"],
    &["real", "table", "stats"],
    &["driver"],
    &["borrow"],
    &["state"],
    &["measure", "nvml", "init", "turns", "pools"],
    &["compute"],
    &["resident"],
    &["hooks"],
    &["families"],
    &["loader"],
];

/// The layer of module `m` in [`LAYERS`].
fn layer(m: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&m))
}

/// Every import goes down [`LAYERS`], every module of src/ has its place
/// there, and the architecture's paragraph names each: the order is the
/// documented one, not merely free of loops.
#[test]
fn the_shim_s_imports_go_down_its_documented_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let g = graph(&root.join("src"));
    let mut wrong = Vec::new();
    for (m, deps) in &g {
        let Some(at) = layer(m) else {
            wrong.push(format!("{m} is in no layer of LAYERS"));
            continue;
        };
        for d in deps {
            if layer(d).is_none_or(|below| below >= at) {
                wrong.push(format!(
                    "{m} (layer {at}) imports {d} (layer {:?})",
                    layer(d)
                ));
            }
        }
    }
    let doc = std::fs::read_to_string(root.join("../../docs/architecture.md")).unwrap();
    for (i, (documented, held)) in documented_layers(&doc).iter().zip(LAYERS).enumerate() {
        let mut held: Vec<&str> = held.to_vec();
        held.sort_unstable();
        if documented != &held {
            wrong.push(format!(
                "docs/architecture.md's layer {i} names {documented:?}, LAYERS holds {held:?}"
            ));
        }
    }
    if documented_layers(&doc).len() != LAYERS.len() {
        wrong.push("docs/architecture.md lists another number of layers".into());
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The layers docs/architecture.md's paragraph lists (`→` between
/// layers), each as the sorted module names it puts in backquotes.
fn documented_layers(doc: &str) -> Vec<Vec<&str>> {
    let start = doc.find("**The shim's layers**").expect("the paragraph");
    let text = &doc[start..];
    let text = &text[..text.find("A module needing").expect("the paragraph's end")];
    let modules: Vec<&str> = LAYERS.iter().flat_map(|l| l.iter().copied()).collect();
    let after_colon = &text[text.find("):").map_or(0, |i| i + 2)..];
    after_colon
        .split('→')
        .map(|segment| {
            let mut named: Vec<&str> = segment
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|w| modules.contains(w))
                .collect();
            named.sort_unstable();
            named.dedup();
            named
        })
        .collect()
}
