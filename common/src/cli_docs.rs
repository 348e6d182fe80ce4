//! What the binaries say of themselves besides `--help`: the version with
//! the commit it was built from, and the man pages and shell completions
//! that the package installs, generated from the same clap definitions as
//! `--help` so that they cannot drift from it.

use clap::Command;
use clap_complete::Shell;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// `--version`: the crates' version and the commit built.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RDMABLK_COMMIT"),
    ")"
);

/// A page the command line does not describe (a file format), rendered by
/// its owner: its file name (`rdmablk-target.toml.5`) and its roff text.
pub struct ExtraPage {
    pub file: String,
    pub roff: String,
}

/// Writes under `dir`: `man/` with a section 8 page for `cmd` and one for
/// each of its visible subcommands (`rdmablk-connect.8`), each naming the
/// others and `see_also` (as `rdmablk-target(8)`), plus `extra`; and
/// completions for bash (`bash/NAME`), zsh (`zsh/_NAME`) and fish
/// (`fish/NAME.fish`).
pub fn write_docs(
    cmd: Command,
    dir: &Path,
    see_also: &[&str],
    extra: &[ExtraPage],
) -> io::Result<()> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let name = cmd.get_name().to_string();
    let man = dir.join("man");
    fs::create_dir_all(&man)?;
    let mut pages = Vec::new();
    collect(&cmd, &mut pages);
    let mut related: Vec<String> = pages.iter().map(page_name).collect();
    related.extend(see_also.iter().map(|s| s.to_string()));
    related.extend(extra.iter().map(|e| file_ref(&e.file)));
    for page in &pages {
        let mut roff = Vec::new();
        clap_mangen::Man::new(page.clone())
            .section("8")
            .manual("rdmablk")
            .source(format!("rdmablk {}", env!("CARGO_PKG_VERSION")))
            .render(&mut roff)?;
        let own = page_name(page);
        let others: Vec<String> = related
            .iter()
            .filter(|r| **r != own)
            .map(|r| {
                let (n, s) = r.trim_end_matches(')').split_once('(').unwrap_or((r, "8"));
                format!(".BR {n} ({s})")
            })
            .collect();
        writeln!(roff, ".SH \"SEE ALSO\"\n{}", others.join(" ,\n"))?;
        fs::write(man.join(format!("{}.8", display_name(page))), roff)?;
    }
    for e in extra {
        fs::write(man.join(&e.file), &e.roff)?;
    }
    for (shell, file) in [
        (Shell::Bash, name.clone()),
        (Shell::Zsh, format!("_{name}")),
        (Shell::Fish, format!("{name}.fish")),
    ] {
        let sub = dir.join(shell.to_string());
        fs::create_dir_all(&sub)?;
        let mut out = fs::File::create(sub.join(file))?;
        clap_complete::generate(shell, &mut cmd, &name, &mut out);
    }
    Ok(())
}

/// `cmd` and its visible subcommands, depth first.
fn collect(cmd: &Command, into: &mut Vec<Command>) {
    into.push(cmd.clone());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, into);
    }
}

/// `rdmablk-connect` for `rdmablk connect` (clap's display name once built).
fn display_name(cmd: &Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string()
}

/// `rdmablk-connect(8)`.
fn page_name(cmd: &Command) -> String {
    format!("{}(8)", display_name(cmd))
}

/// `rdmablk-target.toml(5)` for the file `rdmablk-target.toml.5`.
fn file_ref(file: &str) -> String {
    match file.rsplit_once('.') {
        Some((n, s)) => format!("{n}({s})"),
        None => file.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn cli() -> Command {
        Command::new("tool")
            .about("Does things.")
            .arg(
                Arg::new("verbose")
                    .long("verbose")
                    .action(ArgAction::SetTrue),
            )
            .subcommand(
                Command::new("run")
                    .about("Runs.")
                    .arg(Arg::new("fast").long("fast")),
            )
            .subcommand(Command::new("secret").hide(true))
    }

    #[test]
    fn a_page_per_visible_subcommand_and_completions_per_shell() {
        let dir = std::env::temp_dir().join(format!("rdmablk-cli-docs-{}", std::process::id()));
        let extra = ExtraPage {
            file: "tool.toml.5".into(),
            roff: ".TH TOOL.TOML 5\n".into(),
        };
        write_docs(cli(), &dir, &["other(8)"], &[extra]).expect("written");
        let page = fs::read_to_string(dir.join("man/tool.8")).expect("tool.8");
        assert!(page.contains(".TH tool 8"), "{page}");
        assert!(page.contains("verbose"), "{page}");
        assert!(
            page.contains(".BR tool\\-run (8)") || page.contains(".BR tool-run (8)"),
            "{page}"
        );
        assert!(page.contains(".BR tool.toml (5)"), "{page}");
        assert!(page.contains(".BR other (8)"), "{page}");
        let run = fs::read_to_string(dir.join("man/tool-run.8")).expect("tool-run.8");
        assert!(run.contains("fast"), "{run}");
        assert!(
            !dir.join("man/tool-secret.8").exists(),
            "a hidden subcommand has no page"
        );
        assert!(dir.join("man/tool.toml.5").exists());
        let bash = fs::read_to_string(dir.join("bash/tool")).expect("bash");
        assert!(bash.contains("--verbose") && bash.contains("run"), "{bash}");
        assert!(dir.join("zsh/_tool").exists() && dir.join("fish/tool.fish").exists());
        fs::remove_dir_all(&dir).expect("cleaned");
    }

    #[test]
    fn the_version_names_a_commit() {
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")), "{VERSION}");
        assert!(VERSION.contains("(commit "), "{VERSION}");
    }
}
