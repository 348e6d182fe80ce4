//! rdmablk-target.toml(5): the configuration file's man page, rendered from
//! the annotated reference configuration (`config/target.toml`) so that the
//! two cannot drift; a test checks that every key the parser accepts is in
//! the reference.
//!
//! The reference is read as blocks (separated by blank lines) of units: a
//! run of comment prose, then the TOML lines it describes (commented out or
//! not). A table's first header starts a section; a key becomes a tagged
//! paragraph; a table seen before, or lines that are no single key, are an
//! example.

use std::collections::BTreeSet;

/// The annotated reference.
pub const REFERENCE: &str = include_str!("../../../config/target.toml");

/// The man page's file name.
pub const PAGE_FILE: &str = "rdmablk-target.toml.5";

/// One line of the reference, without its indentation and comment mark.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Line<'a> {
    Blank,
    Prose(&'a str),
    Toml(&'a str),
}

fn classify(line: &str) -> Line<'_> {
    let t = line.trim();
    if t.is_empty() {
        return Line::Blank;
    }
    let Some(body) = t.strip_prefix('#') else {
        return Line::Toml(t);
    };
    let body = body.strip_prefix(' ').unwrap_or(body);
    if table_of(body).is_some() || key_of(body).is_some() {
        Line::Toml(body)
    } else {
        Line::Prose(body)
    }
}

/// `pollers` of `[pollers]`, `subsystem.host` of `[[subsystem.host]]`.
fn table_of(line: &str) -> Option<&str> {
    let inner = line.trim_start_matches('[').trim_end_matches(']');
    let plain = |c: char| c.is_ascii_lowercase() || c == '_' || c == '.';
    (line.starts_with('[') && line.ends_with(']') && !inner.is_empty() && inner.chars().all(plain))
        .then_some(inner)
}

/// `count` of `count = 4`.
pub(super) fn key_of(line: &str) -> Option<&str> {
    let (key, _) = line.split_once(" = ")?;
    let plain = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    (!key.is_empty() && key.chars().all(plain)).then_some(key)
}

/// A run of prose and the TOML lines it describes.
#[derive(Default)]
struct Unit<'a> {
    prose: Vec<&'a str>,
    toml: Vec<&'a str>,
}

fn units(text: &str) -> Vec<Unit<'_>> {
    let mut out: Vec<Unit> = Vec::new();
    let mut cur = Unit::default();
    for line in text.lines().map(classify) {
        match line {
            Line::Blank => {
                if !cur.prose.is_empty() || !cur.toml.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            Line::Prose(p) => {
                if !cur.toml.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                cur.prose.push(p);
            }
            Line::Toml(t) => cur.toml.push(t),
        }
    }
    if !cur.prose.is_empty() || !cur.toml.is_empty() {
        out.push(cur);
    }
    out
}

/// Text made safe for roff: backslashes, and a leading dot or quote.
fn escape(text: &str) -> String {
    let t = text.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with('.') || t.starts_with('\'') {
        format!("\\&{t}")
    } else {
        t
    }
}

/// Prose lines as paragraphs (an empty line starts a new one).
fn paragraphs(out: &mut String, prose: &[&str]) {
    for p in prose {
        if p.is_empty() {
            out.push_str(".PP\n");
        } else {
            out.push_str(&escape(p));
            out.push('\n');
        }
    }
}

/// TOML lines shown as they are.
fn example(out: &mut String, toml: &[&str]) {
    out.push_str(".RS 4\n.nf\n");
    for t in toml {
        out.push_str(&format!("\\fB{}\\fR\n", escape(t)));
    }
    out.push_str(".fi\n.RE\n");
}

/// Keys as tagged paragraphs: each with its own inline comment when they
/// have one, else all sharing the unit's prose.
fn keys(out: &mut String, toml: &[&str], prose: &[&str]) {
    if toml.iter().any(|t| t.contains("  #")) {
        paragraphs(out, prose);
        for t in toml {
            let (code, note) = t.split_once("  #").unwrap_or((t, ""));
            out.push_str(&format!(".TP\n\\fB{}\\fR\n", escape(code.trim_end())));
            out.push_str(&escape(note.trim()));
            out.push('\n');
        }
        return;
    }
    for (i, t) in toml.iter().enumerate() {
        out.push_str(if i == 0 { ".TP\n" } else { ".TQ\n" });
        out.push_str(&format!("\\fB{}\\fR\n", escape(t)));
    }
    paragraphs(out, prose);
}

/// One key's TOML, its continuation lines (a multi-line array) joined.
fn one_key(toml: &[&str]) -> Option<String> {
    key_of(toml.first()?)?;
    if toml[1..].iter().any(|t| key_of(t).is_some()) {
        return None;
    }
    Some(toml.join(" "))
}

/// The page, in roff.
pub fn page() -> String {
    let v = env!("CARGO_PKG_VERSION");
    let mut out = format!(
        ".TH RDMABLK\\-TARGET.TOML 5 \"\" \"rdmablk {v}\" \"rdmablk\"\n\
         .SH NAME\nrdmablk\\-target.toml \\- configuration of the rdmablk NVMe over Fabrics target\n\
         .SH SYNOPSIS\n/etc/rdmablk/target.toml\n\
         .SH DESCRIPTION\n\
         .BR rdmablk\\-target (8)\nreads this TOML file with \\fB\\-\\-config\\fR \
         (the packaged service: /etc/rdmablk/target.toml).\n\
         \\fBrdmablk\\-target \\-\\-check \\-\\-config\\fR \\fIFILE\\fR checks it without serving;\n\
         \\fBrdmablk\\-target reload\\fR (or \\fBsystemctl reload rdmablk\\-target\\fR) applies \
         an edited file to the running daemon, or names the key it refuses.\n\
         .PP\nWhat follows is the annotated reference configuration, which the package installs \
         as /usr/share/doc/rdmablk\\-target/examples/target.toml; keys shown commented out \
         are optional, with their defaults or an example value.\n"
    );
    let mut seen = BTreeSet::new();
    for u in units(REFERENCE) {
        let table = u.toml.first().and_then(|t| table_of(t));
        match table {
            Some(name) if seen.insert(name.to_string()) => {
                let bracket = if u.toml[0].starts_with("[[") {
                    "[["
                } else {
                    "["
                };
                let close = if bracket == "[[" { "]]" } else { "]" };
                let level = if name.contains('.') { ".SS" } else { ".SH" };
                out.push_str(&format!("{level} \"{bracket}{name}{close}\"\n"));
                paragraphs(&mut out, &u.prose);
                if u.toml.len() > 1 {
                    keys(&mut out, &u.toml[1..], &[]);
                }
            }
            Some(_) => {
                out.push_str(".PP\n");
                paragraphs(&mut out, &u.prose);
                example(&mut out, &u.toml);
            }
            None if u.toml.is_empty() => {
                out.push_str(".PP\n");
                paragraphs(&mut out, &u.prose);
            }
            None => match one_key(&u.toml) {
                Some(key) => keys(&mut out, &[key.as_str()], &u.prose),
                None if u.toml.iter().all(|t| key_of(t).is_some()) => {
                    keys(&mut out, &u.toml, &u.prose)
                }
                None => {
                    out.push_str(".PP\n");
                    paragraphs(&mut out, &u.prose);
                    example(&mut out, &u.toml);
                }
            },
        }
    }
    out.push_str(
        ".SH FILES\n/etc/rdmablk/target.toml\n.br\n\
         /usr/share/doc/rdmablk\\-target/examples/\n\
         .SH \"SEE ALSO\"\n.BR rdmablk\\-target (8),\n.BR rdmablk\\-target\\-reload (8),\n\
         .BR rdmablk (8)\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_starts_a_section_and_a_key_a_tagged_paragraph() {
        let p = page();
        assert!(p.starts_with(".TH RDMABLK\\-TARGET.TOML 5"), "{p}");
        for section in [
            ".SH \"[pollers]\"",
            ".SH \"[limits]\"",
            ".SH \"[[listener]]\"",
            ".SH \"[[subsystem]]\"",
            ".SS \"[[subsystem.host]]\"",
            ".SS \"[[subsystem.namespace]]\"",
            ".SH \"[gateway_group]\"",
        ] {
            assert_eq!(p.matches(section).count(), 1, "{section} once\n{p}");
        }
        assert!(
            p.contains(".TP\n\\fBarena = \"64MiB\"\\fR\nBuffer arena per poller"),
            "{p}"
        );
        // A key shown with its inline comment.
        assert!(
            p.contains("\\fBname = \"rack\\-1\"\\fR\nrequired: the group"),
            "{p}"
        );
        // A table seen before is an example.
        assert!(
            p.contains(".nf\n\\fB[[listener]]\\fR\n\\fBtransport = \"rdma\"\\fR"),
            "{p}"
        );
        assert!(!p
            .lines()
            .any(|l| l.starts_with('.') && l.len() > 1 && l.chars().nth(1) == Some(' ')));
    }

    #[test]
    fn prose_toml_and_blank_lines_are_told_apart() {
        assert_eq!(classify("  # count = 4"), Line::Toml("count = 4"));
        assert_eq!(
            classify("# [[subsystem.host]]"),
            Line::Toml("[[subsystem.host]]")
        );
        assert_eq!(
            classify("arena = \"64MiB\""),
            Line::Toml("arena = \"64MiB\"")
        );
        assert_eq!(classify("    \"nqn.x\","), Line::Toml("\"nqn.x\","));
        assert_eq!(classify("# Default: 4096."), Line::Prose("Default: 4096."));
        assert_eq!(
            classify("# tables (tls_key). A reload may change it."),
            Line::Prose("tables (tls_key). A reload may change it.")
        );
        assert_eq!(classify("#"), Line::Prose(""));
        assert_eq!(classify("   "), Line::Blank);
    }

    #[test]
    fn roff_control_characters_are_escaped() {
        assert_eq!(escape(".hidden"), "\\&.hidden");
        assert_eq!(escape("a\\b-c"), "a\\eb\\-c");
    }
}
