//! The import graph of a crate's modules, and its cycles (`make layers`, part of `make test`).
//!
//! A module is a file. Module A depends on module B when A's code names an item by a path
//! that resolves into B: `crate::…`, `super::…`, `self::…`, or one starting with the name of
//! one of A's child modules. A path resolves to the deepest module it names; an item a module
//! only hands on (`pub use` / `pub(crate) use`) is followed to where it comes from. Not
//! dependencies: `mod` declarations and those re-exports themselves (a parent handing its
//! children's names on, even where it also uses the name), items under a `#[cfg(…)]` naming
//! `test`, comments. Paths into other crates are not followed (crates are layered by Cargo:
//! server → app → core). Known limits: code inside an inline (non-test) `mod x { … }` is read
//! as its file's; `r##"…"##` strings and nested block comments are not recognised.
//!
//! The rule it checks: within a crate, the dependency graph has no cycle. It reads source as
//! text (no macro expansion): a path built by a macro is not seen.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path inside its crate, e.g. `["pipeline", "gate"]`; the root is `[]`.
pub type ModPath = Vec<String>;

/// One crate's modules: their files, their re-exports, and what each depends on.
#[derive(Debug, Default)]
pub struct Graph {
    /// Module → its file.
    pub files: BTreeMap<ModPath, PathBuf>,
    /// Module → re-exported name → the path it comes from.
    reexports: BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    /// Module → (path named, as written, already made absolute).
    named: BTreeMap<ModPath, BTreeSet<ModPath>>,
    /// Module → the modules it depends on (after resolution).
    pub edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

/// Reads the crate whose root file is `root` (`src/lib.rs` or `src/main.rs`).
pub fn read_crate(root: &Path) -> std::io::Result<Graph> {
    let mut g = Graph::default();
    let dir = root.parent().unwrap_or(Path::new("."));
    collect(&mut g, dir, root, Vec::new())?;
    g.resolve();
    Ok(g)
}

fn collect(g: &mut Graph, dir: &Path, file: &Path, path: ModPath) -> std::io::Result<()> {
    let text = strip(&std::fs::read_to_string(file)?);
    g.files.insert(path.clone(), file.to_path_buf());
    let children = child_modules(&text);
    for child in &children {
        // `foo.rs` or `foo/mod.rs` beside a root / mod.rs file; under `foo/` for `foo.rs`.
        let base = if file
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs")
        {
            dir.to_path_buf()
        } else {
            dir.join(file.file_stem().unwrap_or_default())
        };
        // `child` may be `inline/name` (declared inside an inline `mod inline { … }`).
        let flat = base.join(format!("{child}.rs"));
        let nested = base.join(child).join("mod.rs");
        // The folder holding the child's file: its own children are looked for from there.
        let (next_file, next_dir) = if flat.is_file() {
            (flat.clone(), flat.parent().unwrap_or(&base).to_path_buf())
        } else if nested.is_file() {
            (nested, base.join(child))
        } else {
            continue;
        };
        let mut p = path.clone();
        p.extend(child.split('/').map(str::to_string));
        collect(g, &next_dir, &next_file, p)?;
    }
    let (named, reexports) = references(&text, &path, &children);
    g.named.insert(path.clone(), named);
    g.reexports.insert(path, reexports);
    Ok(())
}

/// The text without comments, string literals and `#[cfg(test)]` modules.
pub fn strip(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if text[i..].starts_with("//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if text[i..].starts_with("/*") {
            i = text[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
        } else if text[i..].starts_with("r#\"") || text[i..].starts_with("r\"") {
            let hashes = if b[i + 1] == b'#' { 1 } else { 0 };
            let close = if hashes == 1 { "\"#" } else { "\"" };
            let start = i + 2 + hashes;
            i = text[start..]
                .find(close)
                .map_or(b.len(), |e| start + e + close.len());
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\'', '\n'); lifetimes ('a) pass through.
            let end = text[i + 1..].find('\'').map_or(b.len(), |e| i + 1 + e + 1);
            i = if b[i + 1] == b'\\' {
                text[i + 3..].find('\'').map_or(b.len(), |e| i + 3 + e + 1)
            } else {
                end
            };
            out.push_str("' '");
        } else {
            let c = text[i..].chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    drop_test_modules(&out)
}

/// Where the next test-only attribute starts: `#[cfg(…)]` naming `test` (`#[cfg(test)]`,
/// `#[cfg(all(test, feature = "ssr"))]`), not under a `not(…)`.
fn next_test_cfg(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = text[from..].find("#[cfg(") {
        let at = from + k;
        let end = text[at..].find(")]").map_or(text.len(), |e| at + e);
        let inside = &text[at + 6..end];
        let names_test = inside.split(|c: char| !is_ident(c)).any(|w| w == "test");
        if names_test && !inside.contains("not(") {
            return Some(at);
        }
        from = end;
    }
    None
}

fn drop_test_modules(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(at) = next_test_cfg(&out) {
        let rest = &out[at..];
        // The item after the attribute: up to its matching brace, or its semicolon.
        let Some(open) = rest.find(['{', ';']) else {
            break;
        };
        let end = if rest.as_bytes()[open] == b';' {
            at + open + 1
        } else {
            let mut depth = 0usize;
            let mut end = out.len();
            for (k, ch) in rest[open..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = at + open + k + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            end
        };
        out.replace_range(at..end, "");
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `mod x;` declarations in files: `x` at the top level, `inline/x` inside an inline
/// `mod inline { … }` at the top level (such an inline module's own code is read as this
/// file's: a `super::` inside it resolves one level too high, a known limit).
fn child_modules(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut inline: Option<(String, usize)> = None;
    for line in text.lines() {
        let l = line.trim();
        let l = l
            .strip_prefix("pub(crate) ")
            .or_else(|| l.strip_prefix("pub(super) "))
            .or_else(|| l.strip_prefix("pub "))
            .unwrap_or(l);
        if let Some(rest) = l.strip_prefix("mod ") {
            if let Some(name) = rest.strip_suffix(';')
                && name.chars().all(is_ident)
            {
                match &inline {
                    Some((outer, d)) if depth == d + 1 => out.push(format!("{outer}/{name}")),
                    None if depth == 0 => out.push(name.to_string()),
                    _ => {}
                }
            } else if let Some(name) = rest.strip_suffix('{').map(str::trim)
                && depth == 0
                && name.chars().all(is_ident)
            {
                inline = Some((name.to_string(), depth));
            }
        }
        for ch in line.chars() {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if inline.as_ref().is_some_and(|(_, d)| *d == depth) {
                        inline = None;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Every path `text` names (made absolute from `here`), and its re-exports.
fn references(
    text: &str,
    here: &ModPath,
    children: &[String],
) -> (BTreeSet<ModPath>, BTreeMap<String, ModPath>) {
    let mut named = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    // `use` trees, expanded.
    let mut rest = text;
    let mut spans = Vec::new();
    while let Some(at) = find_use(rest) {
        let start = text.len() - rest.len() + at.0;
        let body_start = start + at.1;
        let Some(end) = text[body_start..].find(';') else {
            break;
        };
        let public = at.2;
        let tree = &text[body_start..body_start + end];
        for (path, alias) in expand(tree) {
            if let Some(abs) = absolute(&path, here, children) {
                if public {
                    if let Some(alias) = alias.or_else(|| abs.last().cloned())
                        && alias != "*"
                    {
                        reexports.insert(alias, abs);
                    }
                } else {
                    named.insert(abs);
                }
            }
        }
        spans.push((start, body_start + end));
        rest = &text[body_start + end..];
    }
    // Paths in code: crate::…, super::…, self::… outside `use` items.
    let mut code = String::new();
    let mut last = 0;
    for (s, e) in spans {
        code.push_str(&text[last..s]);
        last = e;
    }
    code.push_str(&text[last..]);
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':');
        if boundary {
            let child_heads: Vec<String> = children.iter().map(|c| format!("{c}::")).collect();
            let heads = ["crate::", "super::", "self::"]
                .into_iter()
                .map(str::to_string)
                .chain(child_heads);
            for head in heads {
                if chars[i..].iter().take(head.len()).copied().eq(head.chars()) {
                    let mut j = i;
                    while j < chars.len() && (is_ident(chars[j]) || chars[j] == ':') {
                        j += 1;
                    }
                    let path: String = chars[i..j].iter().collect();
                    let segs: Vec<String> = path
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                    if let Some(abs) = absolute(&segs, here, children) {
                        named.insert(abs);
                    }
                    i = j;
                    break;
                }
            }
        }
        i += 1;
    }
    (named, reexports)
}

/// The next `use` item: (offset of `use`, length up to the tree, public).
fn find_use(text: &str) -> Option<(usize, usize, bool)> {
    let mut from = 0;
    while let Some(k) = text[from..].find("use ") {
        let at = from + k;
        let before = text[..at].trim_end_matches([' ', '\t']);
        let line_start = before.is_empty() || before.ends_with(['\n', '{', ';', '}']);
        let public = ["pub", "pub(crate)", "pub(super)", "pub(in crate)"]
            .iter()
            .any(|p| before.ends_with(p));
        if line_start || public {
            return Some((at, 4, public));
        }
        from = at + 4;
    }
    None
}

/// A `use` tree as its paths, each with the alias it is bound to (if any).
pub fn expand(tree: &str) -> Vec<(Vec<String>, Option<String>)> {
    let compact: String = tree
        .chars()
        .filter(|c| !c.is_whitespace() || *c == ' ')
        .collect();
    let mut out = Vec::new();
    expand_into(compact.trim(), &mut Vec::new(), &mut out);
    out
}

fn expand_into(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let tree = tree.trim().trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let head = &tree[..open];
        let inner = tree[open + 1..]
            .trim_end()
            .strip_suffix('}')
            .unwrap_or(&tree[open + 1..]);
        let base: Vec<String> = head
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let n = base.len();
        prefix.extend(base);
        for part in split_top(inner) {
            expand_into(part, prefix, out);
        }
        prefix.truncate(prefix.len() - n);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut full = prefix.clone();
    full.extend(
        path.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    );
    if full.last().is_some_and(|l| l == "self") {
        full.pop();
    }
    if !full.is_empty() {
        out.push((full, alias));
    }
}

fn split_top(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (k, ch) in inner.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// `path` as seen from module `here` made absolute within the crate; `None` for another
/// crate's path.
fn absolute(path: &[String], here: &ModPath, children: &[String]) -> Option<ModPath> {
    let first = path.first()?;
    let mut abs: ModPath;
    let mut rest = path;
    match first.as_str() {
        "crate" => {
            abs = Vec::new();
            rest = &path[1..];
        }
        "self" => {
            abs = here.clone();
            rest = &path[1..];
        }
        "super" => {
            abs = here.clone();
            while rest.first().is_some_and(|s| s == "super") {
                abs.pop()?;
                rest = &rest[1..];
            }
        }
        name if children.iter().any(|c| c == name) => {
            abs = here.clone();
        }
        _ => return None,
    }
    abs.extend(rest.iter().cloned());
    Some(abs)
}

impl Graph {
    /// The deepest module `path` names.
    fn module_of(&self, path: &ModPath) -> ModPath {
        let mut p = path.clone();
        while !p.is_empty() && !self.files.contains_key(&p) {
            p.pop();
        }
        p
    }

    /// Where `path` leads once re-exports are followed (a bounded number of hops).
    fn target(&self, path: &ModPath) -> ModPath {
        let mut p = path.clone();
        for _ in 0..16 {
            let module = self.module_of(&p);
            let Some(name) = p.get(module.len()) else {
                return module;
            };
            match self.reexports.get(&module).and_then(|r| r.get(name)) {
                Some(from) => {
                    let mut next = from.clone();
                    next.extend(p[module.len() + 1..].iter().cloned());
                    p = next;
                }
                None => return module,
            }
        }
        self.module_of(&p)
    }

    fn resolve(&mut self) {
        let mut edges: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
        for (from, paths) in &self.named {
            let set = edges.entry(from.clone()).or_default();
            for p in paths {
                let to = self.target(p);
                if &to != from {
                    set.insert(to);
                }
            }
        }
        self.edges = edges;
    }

    /// The modules in order, and each one's dependencies as indices into that order.
    fn adjacency(&self) -> (Vec<&ModPath>, Vec<Vec<usize>>) {
        let nodes: Vec<&ModPath> = self.files.keys().collect();
        let index: BTreeMap<&ModPath, usize> =
            nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let adj = nodes
            .iter()
            .map(|n| {
                self.edges
                    .get(*n)
                    .map(|s| s.iter().filter_map(|t| index.get(t).copied()).collect())
                    .unwrap_or_default()
            })
            .collect();
        (nodes, adj)
    }

    /// The cycles: each strongly connected set of two or more modules, as file paths.
    pub fn cycles(&self) -> Vec<Vec<PathBuf>> {
        let (nodes, adj) = self.adjacency();
        tarjan(&adj)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut files: Vec<PathBuf> =
                    c.iter().map(|&i| self.files[nodes[i]].clone()).collect();
                files.sort();
                files
            })
            .collect()
    }

    /// The edges inside `cycle` (files), as "a -> b" lines, for a readable failure.
    pub fn explain(&self, cycle: &[PathBuf]) -> Vec<String> {
        let in_cycle: BTreeMap<&PathBuf, &ModPath> = self
            .files
            .iter()
            .filter(|(_, f)| cycle.contains(f))
            .map(|(m, f)| (f, m))
            .collect();
        let mut out = Vec::new();
        for (file, module) in &in_cycle {
            for to in self.edges.get(*module).into_iter().flatten() {
                if let Some(tf) = self.files.get(to)
                    && cycle.contains(tf)
                {
                    out.push(format!("{} -> {}", file.display(), tf.display()));
                }
            }
        }
        out
    }
}

/// Strongly connected components (Tarjan), iterative.
fn tarjan(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = adj.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on = vec![false; n];
    let mut stack = Vec::new();
    let mut out = Vec::new();
    let mut next = 0;
    for s in 0..n {
        if index[s] != usize::MAX {
            continue;
        }
        let mut work = vec![(s, 0usize)];
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if *k < adj[v].len() {
                let w = adj[v][*k];
                *k += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(comp);
            }
        }
    }
    out
}

impl Graph {
    /// The modules floor by floor, from the ground up: a module stands one floor above the
    /// highest module it depends on (the modules of a cycle share their floor).
    pub fn floors(&self) -> Vec<Vec<ModPath>> {
        let (nodes, adj) = self.adjacency();
        // Tarjan yields components dependencies first: each one's floor is known in turn.
        let components = tarjan(&adj);
        let mut component_of = vec![0; nodes.len()];
        for (c, members) in components.iter().enumerate() {
            for &m in members {
                component_of[m] = c;
            }
        }
        let mut floor = vec![0usize; components.len()];
        for (c, members) in components.iter().enumerate() {
            let mut f = 0;
            for &m in members {
                for &d in &adj[m] {
                    if component_of[d] != c {
                        f = f.max(floor[component_of[d]] + 1);
                    }
                }
            }
            floor[c] = f;
        }
        let top = floor.iter().copied().max().unwrap_or(0);
        let mut out = vec![Vec::new(); top + 1];
        for (i, n) in nodes.iter().enumerate() {
            out[floor[component_of[i]]].push((*n).clone());
        }
        out
    }
}
