//! The top-level `Dockerfile` checked without Docker (none runs here): a build stage on the Rust
//! toolchain pinned in `rust-toolchain.toml` that builds the release binary from the committed
//! lock file, a slim runtime stage that runs it as a non-root user through its `ENTRYPOINT`; every
//! file the build embeds (`include_str!`, `include_bytes!`, `sqlx::migrate!`) is in the build
//! context `.dockerignore` leaves, and every file the binary reads from disk at run time (static
//! files it serves) is copied into the runtime stage.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // tests may fail loudly

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// One instruction: keyword (upper case) and its arguments, continuation lines joined.
#[derive(Debug)]
struct Instruction {
    keyword: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    image: String,
    name: Option<String>,
    body: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.body
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.args.as_str())
    }

    fn last<'a>(&'a self, keyword: &'a str) -> Option<&'a str> {
        self.all(keyword).last()
    }
}

fn parse_dockerfile(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    let mut stages: Vec<Stage> = Vec::new();
    for line in logical.into_iter().filter(|l| !l.trim().is_empty()) {
        let (keyword, args) = line.split_once(' ').unwrap_or((&line, ""));
        let keyword = keyword.to_ascii_uppercase();
        let args = args.trim().to_owned();
        if keyword == "FROM" {
            let words: Vec<&str> = args.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some((*name).to_owned()),
                _ => None,
            };
            stages.push(Stage {
                image: words[0].to_owned(),
                name,
                body: Vec::new(),
            });
        } else if keyword != "ARG" || !stages.is_empty() {
            stages
                .last_mut()
                .expect("an instruction before FROM")
                .body
                .push(Instruction { keyword, args });
        }
    }
    stages
}

/// Docker's `.dockerignore`: the last pattern that matches a path (or one of its parents)
/// decides; `!` re-includes; `*` is one path segment's wildcard, `**` any number of segments.
fn in_context(ignore: &str, path: &str) -> bool {
    let mut included = true;
    for line in ignore.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (negate, pattern) = match line.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, line),
        };
        let pattern: Vec<&str> = pattern.trim_matches('/').split('/').collect();
        let segments: Vec<&str> = path.split('/').collect();
        let hit = (1..=segments.len()).any(|n| glob(&pattern, &segments[..n]));
        if hit {
            included = negate;
        }
    }
    included
}

fn glob(pattern: &[&str], path: &[&str]) -> bool {
    match (pattern.first(), path.first()) {
        (None, None) => true,
        (Some(&"**"), _) => {
            glob(&pattern[1..], path) || (!path.is_empty() && glob(pattern, &path[1..]))
        }
        (Some(p), Some(s)) => segment(p, s) && glob(&pattern[1..], &path[1..]),
        _ => false,
    }
}

fn segment(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, tail)) => {
            s.starts_with(head)
                && (head.len()..=s.len()).any(|i| s.is_char_boundary(i) && segment(tail, &s[i..]))
        }
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out
}

/// The string literal arguments of `macro!(` / `call(` occurrences in `text`.
fn literal_args<'a>(text: &'a str, call: &str) -> Vec<&'a str> {
    text.match_indices(call)
        .filter_map(|(i, _)| {
            let rest = text[i + call.len()..].trim_start();
            let rest = rest.strip_prefix('"')?;
            Some(&rest[..rest.find('"')?])
        })
        .collect()
}

/// The crates the binary is built from (the workspace's members but the browser-only frontend).
const CRATES: [&str; 5] = ["server", "app", "core", "engine-sim", "adapter-check"];

fn relative(path: &Path) -> String {
    let root = root().canonicalize().unwrap();
    path.canonicalize()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .strip_prefix(&root)
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

#[test]
fn the_build_stage_uses_the_pinned_toolchain_and_the_lock_file() {
    let stages = parse_dockerfile(&std::fs::read_to_string(root().join("Dockerfile")).unwrap());
    assert!(stages.len() >= 2, "multi-stage: {stages:?}");
    let toolchain: toml::Value =
        toml::from_str(&std::fs::read_to_string(root().join("rust-toolchain.toml")).unwrap())
            .unwrap();
    let channel = toolchain["toolchain"]["channel"].as_str().unwrap();
    let build = &stages[0];
    let tag = build
        .image
        .strip_prefix("rust:")
        .unwrap_or_else(|| panic!("the build stage is an official Rust image: {}", build.image));
    assert!(
        tag == channel || tag.starts_with(&format!("{channel}-")),
        "build image {} does not match rust-toolchain.toml's {channel}",
        build.image
    );
    let run = build.all("RUN").collect::<Vec<_>>().join(" ");
    for needed in ["cargo build", "--release", "--locked", "-p tokenfactory"] {
        assert!(run.contains(needed), "the build runs {needed}: {run}");
    }
}

#[test]
fn the_runtime_stage_is_slim_non_root_and_runs_the_binary() {
    let stages = parse_dockerfile(&std::fs::read_to_string(root().join("Dockerfile")).unwrap());
    let build = stages[0].name.clone().expect("the build stage is named");
    let runtime = stages.last().unwrap();
    assert!(
        !runtime.image.starts_with("rust:"),
        "no toolchain at run time: {}",
        runtime.image
    );
    assert!(
        runtime.image.contains("slim") || runtime.image.contains("distroless"),
        "a slim base: {}",
        runtime.image
    );
    let user = runtime.last("USER").expect("the runtime stage sets USER");
    let uid = user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "a numeric non-root user (runAsNonRoot can check it): {user}"
    );
    let entrypoint: Vec<String> =
        serde_json::from_str(runtime.last("ENTRYPOINT").expect("an ENTRYPOINT"))
            .expect("ENTRYPOINT in exec form (signals reach the binary)");
    let binary = &entrypoint[0];
    // The binary copied from the build stage is what runs, and it is all that is copied.
    let copies: Vec<&str> = runtime.all("COPY").collect();
    assert_eq!(copies.len(), 1, "only the binary: {copies:?}");
    let words: Vec<&str> = copies[0].split_whitespace().collect();
    assert_eq!(words[0], format!("--from={build}"));
    assert!(words[1].ends_with("/tokenfactory"), "{copies:?}");
    assert_eq!(words.last().unwrap(), binary);
    // The default command is the server.
    let cmd: Vec<String> = serde_json::from_str(runtime.last("CMD").unwrap()).unwrap();
    assert_eq!(cmd, ["serve"]);
}

/// What the build embeds must be in the context `.dockerignore` leaves; what the binary reads at
/// run time must be in the runtime stage. The portal's assets are compiled in and the Leptos site
/// root serves nothing, so today the second list is empty: a future `ServeDir` fails here until
/// the Dockerfile copies its directory.
#[test]
fn every_file_the_binary_needs_reaches_the_image() {
    let ignore = std::fs::read_to_string(root().join(".dockerignore")).unwrap();
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let stages = parse_dockerfile(&dockerfile);
    let build_copies = stages[0].all("COPY").collect::<Vec<_>>();
    assert!(
        build_copies.contains(&". ."),
        "the build stage copies the context: {build_copies:?}"
    );
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "rust-toolchain.toml",
        ".cargo/config.toml",
    ] {
        assert!(in_context(&ignore, file), "{file} is ignored");
    }
    assert!(!in_context(&ignore, "target/debug/tokenfactory"));
    assert!(!in_context(&ignore, "server/target/x"));
    assert!(!in_context(&ignore, ".git/HEAD"));
    assert!(!in_context(&ignore, "end2end/node_modules/x/index.js"));

    let mut embedded = Vec::new();
    let mut served = Vec::new();
    for krate in CRATES {
        let dir = root().join(krate);
        assert!(in_context(&ignore, &format!("{krate}/Cargo.toml")));
        for file in sources(&dir.join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            let here = file.parent().unwrap();
            for call in ["include_str!(", "include_bytes!("] {
                for arg in literal_args(&text, call) {
                    embedded.push(relative(&here.join(arg)));
                }
            }
            for arg in literal_args(&text, "migrate!(") {
                embedded.push(relative(&dir.join(arg)));
            }
            for call in ["ServeDir::new(", "ServeFile::new(", "LEPTOS_SITE_ROOT"] {
                served.extend(
                    text.contains(call)
                        .then(|| format!("{}: {call}", relative(&file))),
                );
            }
        }
    }
    for must in ["migrations", "style/main.css", "engine-sim/tokenizer.json"] {
        assert!(
            embedded.iter().any(|e| e == must),
            "{must} should be embedded: {embedded:?}"
        );
    }
    for file in &embedded {
        assert!(in_context(&ignore, file), "{file} is embedded but ignored");
    }
    for file in std::fs::read_dir(root().join(".sqlx")).unwrap().flatten() {
        let name = format!(".sqlx/{}", file.file_name().to_string_lossy());
        assert!(in_context(&ignore, &name), "{name}: the offline query data");
    }
    let runtime = stages.last().unwrap();
    let copied: Vec<&str> = runtime.all("COPY").collect();
    assert!(
        served.is_empty(),
        "the binary serves files from disk ({served:?}): copy them into the runtime stage \
         (copies: {copied:?}) and check them here"
    );
}

#[test]
fn the_dockerignore_matcher_follows_dockers_rules() {
    let ignore = "*\n!server\nserver/secret\n**/target\n!keep/**/x.txt\n";
    assert!(!in_context(ignore, "README.md"));
    assert!(in_context(ignore, "server/src/main.rs"));
    assert!(!in_context(ignore, "server/secret/key"));
    assert!(!in_context(ignore, "server/target/debug/a"));
    assert!(in_context(ignore, "keep/a/b/x.txt"));
    assert!(!in_context(ignore, "keep/a/b/y.txt"));
}
