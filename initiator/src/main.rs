//! rdmablk: discover NVMe-oF subsystems, connect a remote namespace and
//! export it locally, or benchmark it.

mod cli;
mod run;

use clap::{CommandFactory, Parser};
use cli::{Cli, Command};
use rdmablk_common::cli_docs;
use std::process::ExitCode;

fn main() -> ExitCode {
    rdmablk_common::abort::abort_on_panic();
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // libublk logs its own progress at info: keep it to warnings.
        .or_else(|_| {
            tracing_subscriber::EnvFilter::try_new(format!("{},libublk=warn", cli.log_level))
        })
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.cmd {
        Command::Discover(t) => run::discover(&t),
        Command::Connect(c) => run::connect(&c),
        Command::Bench(b) => run::bench(&b),
        Command::List(l) => run::list(&l),
        Command::ConnectAll(a) => run::connect_all(&a),
        Command::GenTlsKey(g) => run::gen_tls_key(&g),
        Command::GenerateDocs { dir } => {
            cli_docs::write_docs(Cli::command(), &dir, &["rdmablk-target(8)"], &[])
                .map(|()| ExitCode::SUCCESS)
                .map_err(|e| format!("generate-docs: {}: {e}", dir.display()))
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("rdmablk: {e}");
            ExitCode::FAILURE
        }
    }
}
