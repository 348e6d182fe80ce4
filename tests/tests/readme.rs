//! The README's list of VM scenarios is the scenario files' own: one item
//! per file in `tests/vm/scenarios/`, its name and its header comment,
//! between the README's `<!-- vm-scenarios:begin -->` and
//! `<!-- vm-scenarios:end -->`. A scenario added, removed or described anew
//! without the README fails here; `RDMABLK_UPDATE_README=1 cargo test
//! --release -p rdmablk-tests --test readme` writes the list.

use std::path::{Path, PathBuf};

const BEGIN: &str = "<!-- vm-scenarios:begin -->\n";
const END: &str = "<!-- vm-scenarios:end -->\n";
/// The width the list is wrapped to.
const WIDTH: usize = 80;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate is in the repository")
        .to_path_buf()
}

/// The scenario files (`NN-name.sh`), in the order the VM runs them.
fn scenarios() -> Vec<PathBuf> {
    let dir = repo().join("tests/vm/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.ends_with(".sh") && name.as_bytes().first().is_some_and(u8::is_ascii_digit)
        })
        .collect();
    files.sort();
    files
}

/// A script's header: its leading comment lines, without the `#`, as one
/// paragraph.
fn header(script: &str) -> String {
    script
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `first` then `text`'s words, wrapped at [`WIDTH`], lines after the first
/// indented by `indent` spaces.
fn wrap(first: &str, text: &str, indent: usize) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > WIDTH && !line.trim().is_empty() {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
        } else if !line.ends_with(' ') && !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// The list the README must hold between its markers.
fn expected() -> String {
    let files = scenarios();
    assert!(!files.is_empty(), "no scenario in tests/vm/scenarios");
    files
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let name = path.file_stem().and_then(|n| n.to_str()).expect("a name");
            let about = header(&text);
            assert!(
                !about.is_empty(),
                "{name}: no header comment saying what it tests"
            );
            let first = format!("{}. `{name}`:", i + 1);
            let indent = first.find('`').expect("a backtick");
            wrap(&first, &about, indent)
        })
        .collect()
}

#[test]
fn readme_lists_every_vm_scenario() {
    let path = repo().join("README.md");
    let readme = std::fs::read_to_string(&path).expect("reading README.md");
    let (start, end) = match (readme.find(BEGIN), readme.find(END)) {
        (Some(s), Some(e)) if s < e => (s + BEGIN.len(), e),
        _ => panic!("README.md has no {BEGIN:?} ... {END:?} section"),
    };
    let want = expected();
    if readme[start..end] == want {
        return;
    }
    if std::env::var_os("RDMABLK_UPDATE_README").is_some() {
        let updated = format!("{}{want}{}", &readme[..start], &readme[end..]);
        std::fs::write(&path, updated).expect("writing README.md");
        return;
    }
    panic!(
        "README.md's VM scenario list differs from tests/vm/scenarios/ (each file's name and \
         header comment): write it with RDMABLK_UPDATE_README=1 cargo test --release -p \
         rdmablk-tests --test readme\n--- expected ---\n{want}"
    );
}
