//! `rdmablk discover` and `rdmablk list`.

use super::params::discovery_params;
use super::print::print_entry;
use crate::cli::{ListArgs, Target};
use rdmablk::frontend::state;
use rdmablk::host::Session;
use std::process::ExitCode;

/// Prints the connections `rdmablk connect` serves on this machine.
pub(crate) fn list(l: &ListArgs) -> Result<ExitCode, String> {
    let all = state::list(&state::run_dir());
    if l.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", state::render(&all));
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the discovery log of target `t`.
pub(crate) fn discover(t: &Target) -> Result<ExitCode, String> {
    let p = discovery_params(t)?;
    let entries = Session::discover(&p).map_err(|e| e.to_string())?;
    println!(
        "\nDiscovery Log Number of Records {}, Generation counter 1",
        entries.len()
    );
    for (i, e) in entries.iter().enumerate() {
        print_entry(i, e);
    }
    Ok(ExitCode::SUCCESS)
}
