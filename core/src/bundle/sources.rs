//! A bundle's three texts, as read from disk, stored in the database and exported.
//!
//! # Representation
//!
//! Each of the three texts (registry YAML, Cedar policies, Cedar entity schema) is one
//! string. When a folder holds exactly one file of a kind, the string is that file's text,
//! byte for byte. When it holds several, they are joined in file-name order, each preceded
//! by a *source line* naming it — `# countersign-source: <file>` for YAML,
//! `// countersign-source: <file>` for Cedar — and ending with a newline. Source lines are
//! comments in both languages, and they are what [`split`] cuts on, so problems name the
//! original file and [`BundleSources::to_files`] writes the same files back: read → export
//! → read gives equal sources.
//!
//! INVARIANT: a file that itself contains a line starting with a source marker is refused
//! when read, so splitting is never ambiguous.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{BundleError, BundleProblem, BundleSubject};

/// Starts a YAML source line.
pub(crate) const YAML_MARKER: &str = "# countersign-source: ";
/// Starts a Cedar source line.
pub(crate) const CEDAR_MARKER: &str = "// countersign-source: ";

/// The file a single registry text is exported to.
pub const REGISTRY_FILE: &str = "registry.yaml";
/// The file a single policy text is exported to.
pub const POLICY_FILE: &str = "policy.cedar";
/// The file a single entity-schema text is exported to.
pub const SCHEMA_FILE: &str = "policy.cedarschema";

/// The three texts of a bundle (see the module doc for how several files are kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleSources {
    /// The registry YAML.
    pub registry_yaml: String,
    /// The Cedar policies; empty (or only comments) = a registry-only bundle.
    pub policies: String,
    /// The Cedar entity schema: entity types and shared types, no actions.
    pub policy_schema: String,
}

#[derive(Clone, Copy)]
enum Kind {
    Registry,
    Policies,
    Schema,
}

impl Kind {
    fn of(path: &Path) -> Option<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Some(Self::Registry),
            Some("cedar") => Some(Self::Policies),
            Some("cedarschema") => Some(Self::Schema),
            _ => None,
        }
    }

    fn marker(self) -> &'static str {
        match self {
            Self::Registry => YAML_MARKER,
            Self::Policies | Self::Schema => CEDAR_MARKER,
        }
    }

    fn default_file(self) -> &'static str {
        match self {
            Self::Registry => REGISTRY_FILE,
            Self::Policies => POLICY_FILE,
            Self::Schema => SCHEMA_FILE,
        }
    }

    const ALL: [Kind; 3] = [Self::Registry, Self::Policies, Self::Schema];
}

impl BundleSources {
    /// Reads a bundle: a folder (every `*.yaml` / `*.yml`, `*.cedar` and `*.cedarschema`
    /// file in it, not recursive, other files ignored; at least one YAML file), or a single
    /// `.yaml` / `.yml` file (a registry-only bundle: no policies, no entity schema).
    ///
    /// # Errors
    /// [`BundleError::Io`] when something cannot be read; [`BundleError::Invalid`] for a
    /// folder without YAML, a path that is neither, or a file containing a source line.
    pub fn read(path: &Path) -> Result<Self, BundleError> {
        let io = |source| BundleError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mut files: Vec<PathBuf> = Vec::new();
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).map_err(io)? {
                let p = entry.map_err(io)?.path();
                if Kind::of(&p).is_some() && p.is_file() {
                    files.push(p);
                }
            }
            files.sort();
            if !files
                .iter()
                .any(|f| matches!(Kind::of(f), Some(Kind::Registry)))
            {
                return Err(BundleError::one(
                    path.display().to_string(),
                    "the folder has no registry (*.yaml or *.yml file)",
                ));
            }
        } else if matches!(Kind::of(path), Some(Kind::Registry)) {
            files.push(path.to_path_buf());
        } else {
            return Err(BundleError::one(
                path.display().to_string(),
                "a bundle is a folder, or a single .yaml / .yml registry file",
            ));
        }

        let mut parts: [Vec<(String, String)>; 3] = Default::default();
        let mut problems = Vec::new();
        for f in files {
            let Some(kind) = Kind::of(&f) else { continue };
            let text = std::fs::read_to_string(&f).map_err(|source| BundleError::Io {
                path: f.clone(),
                source,
            })?;
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(line) = text
                .lines()
                .position(|l| l.starts_with(kind.marker().trim_end()))
            {
                problems.push(BundleProblem {
                    source: name.clone(),
                    subject: BundleSubject::File,
                    path: format!("line {}", line + 1),
                    message: format!(
                        "lines starting with `{}` are reserved for joining files",
                        kind.marker().trim_end()
                    ),
                });
            }
            parts[kind as usize].push((name, text));
        }
        if !problems.is_empty() {
            return Err(BundleError::invalid(problems));
        }
        let [registry, policies, schema] = parts;
        Ok(Self {
            registry_yaml: join(&registry, YAML_MARKER),
            policies: join(&policies, CEDAR_MARKER),
            policy_schema: join(&schema, CEDAR_MARKER),
        })
    }

    /// Writes the bundle into `dir` (created if missing) so that [`BundleSources::read`] of
    /// `dir` gives equal sources: a single text to `registry.yaml`, `policy.cedar`,
    /// `policy.cedarschema` (always all three, possibly empty); joined texts back to the
    /// files they were joined from. Returns the files written.
    ///
    /// # Errors
    /// [`BundleError::Invalid`] when a joined file name is not a plain file name of its
    /// kind, or `dir` already holds another bundle file that reading would pick up (the
    /// export would not round-trip); [`BundleError::Io`] when writing fails.
    pub fn to_files(&self, dir: &Path) -> Result<Vec<PathBuf>, BundleError> {
        let mut planned: Vec<(PathBuf, &str)> = Vec::new();
        let mut problems = Vec::new();
        for (kind, text) in Kind::ALL.into_iter().zip(self.texts()) {
            let pieces = split_pieces(text, kind.marker());
            match pieces {
                None => planned.push((dir.join(kind.default_file()), text)),
                Some(pieces) => {
                    for (name, piece) in pieces {
                        let plain = !name.is_empty()
                            && !name.starts_with('.')
                            && !name.contains(['/', '\\'])
                            && Path::new(name).file_name().is_some_and(|n| n == name)
                            && Kind::of(Path::new(name))
                                .is_some_and(|k| k as usize == kind as usize);
                        if plain {
                            planned.push((dir.join(name), piece));
                        } else {
                            problems.push(BundleProblem {
                                source: name.to_owned(),
                                subject: BundleSubject::File,
                                path: String::new(),
                                message: format!(
                                    "cannot export: not a plain `{}` file name",
                                    kind.default_file().rsplit('.').next().unwrap_or_default()
                                ),
                            });
                        }
                    }
                }
            }
        }
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| BundleError::Io { path, source }
        };
        if dir.exists() {
            for entry in std::fs::read_dir(dir).map_err(io(dir))? {
                let p = entry.map_err(io(dir))?.path();
                if Kind::of(&p).is_some() && !planned.iter().any(|(q, _)| *q == p) {
                    problems.push(BundleProblem {
                        source: p.display().to_string(),
                        subject: BundleSubject::File,
                        path: String::new(),
                        message:
                            "cannot export here: reading the folder back would include this file"
                                .into(),
                    });
                }
            }
        }
        if !problems.is_empty() {
            return Err(BundleError::invalid(problems));
        }
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut written = Vec::with_capacity(planned.len());
        for (path, text) in planned {
            std::fs::write(&path, text).map_err(io(&path))?;
            written.push(path);
        }
        Ok(written)
    }

    /// Hex SHA-256 of the three texts, each framed by its length (8 bytes, big-endian), in
    /// the order registry, policies, schema.
    pub fn sha256(&self) -> String {
        let mut h = Sha256::new();
        for text in self.texts() {
            h.update((text.len() as u64).to_be_bytes());
            h.update(text.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The registry's `(file, text)` sources, as [`crate::Registry::from_sources`] takes them.
    pub fn registry_sources(&self) -> Vec<(String, String)> {
        split(&self.registry_yaml, YAML_MARKER, REGISTRY_FILE)
    }

    /// The policies' `(file, text)` sources.
    pub fn policy_sources(&self) -> Vec<(String, String)> {
        split(&self.policies, CEDAR_MARKER, POLICY_FILE)
    }

    /// The entity schema's `(file, text)` sources.
    pub fn schema_sources(&self) -> Vec<(String, String)> {
        split(&self.policy_schema, CEDAR_MARKER, SCHEMA_FILE)
    }

    fn texts(&self) -> [&str; 3] {
        [&self.registry_yaml, &self.policies, &self.policy_schema]
    }
}

/// One file verbatim; several joined with source lines.
fn join(files: &[(String, String)], marker: &str) -> String {
    match files {
        [] => String::new(),
        [(_, text)] => text.clone(),
        several => {
            let mut out = String::new();
            for (name, text) in several {
                out.push_str(marker);
                out.push_str(name);
                out.push('\n');
                out.push_str(text);
                if !text.is_empty() && !text.ends_with('\n') {
                    out.push('\n');
                }
            }
            out
        }
    }
}

/// `None` when `text` has no source line (a single text); otherwise the named pieces (text
/// before the first source line, if any, is a piece named `""`).
fn split_pieces<'a>(text: &'a str, marker: &str) -> Option<Vec<(&'a str, &'a str)>> {
    let mut pieces: Vec<(&str, usize, usize)> = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if let Some(name) = line.strip_prefix(marker) {
            if let Some(last) = pieces.last_mut() {
                last.2 = offset;
            } else if offset > 0 {
                pieces.push(("", 0, offset));
            }
            let body = offset + line.len();
            pieces.push((name.trim_end_matches(['\n', '\r']), body, text.len()));
        }
        offset += line.len();
    }
    if pieces.is_empty() {
        return None;
    }
    Some(
        pieces
            .into_iter()
            .map(|(name, start, end)| (name, &text[start..end]))
            .collect(),
    )
}

/// The `(file, text)` pieces of a text; a single text is one piece named `default`.
pub(crate) fn split(text: &str, marker: &str, default: &str) -> Vec<(String, String)> {
    match split_pieces(text, marker) {
        None => vec![(default.to_owned(), text.to_owned())],
        Some(pieces) => pieces
            .into_iter()
            .map(|(name, piece)| {
                let name = if name.is_empty() { default } else { name };
                (name.to_owned(), piece.to_owned())
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_then_split_gives_the_files_back() {
        let files = vec![
            (
                "a.cedar".to_owned(),
                "permit (principal, action, resource);\n".to_owned(),
            ),
            ("b.cedar".to_owned(), "// no newline".to_owned()),
        ];
        let joined = join(&files, CEDAR_MARKER);
        assert_eq!(
            joined,
            "// countersign-source: a.cedar\npermit (principal, action, resource);\n// countersign-source: b.cedar\n// no newline\n"
        );
        let back = split(&joined, CEDAR_MARKER, POLICY_FILE);
        assert_eq!(back[0], files[0]);
        assert_eq!(
            back[1],
            ("b.cedar".to_owned(), "// no newline\n".to_owned())
        );
        // A single file is kept verbatim.
        assert_eq!(join(&files[1..], CEDAR_MARKER), "// no newline");
        assert_eq!(
            split("x: 1", YAML_MARKER, REGISTRY_FILE),
            [(REGISTRY_FILE.to_owned(), "x: 1".to_owned())]
        );
        assert_eq!(split("", YAML_MARKER, REGISTRY_FILE).len(), 1);
    }

    #[test]
    fn the_hash_frames_each_text() {
        let a = BundleSources {
            registry_yaml: "ab".into(),
            policies: String::new(),
            policy_schema: String::new(),
        };
        let b = BundleSources {
            registry_yaml: "a".into(),
            policies: "b".into(),
            policy_schema: String::new(),
        };
        assert_ne!(a.sha256(), b.sha256());
        assert_eq!(a.sha256().len(), 64);
    }
}
