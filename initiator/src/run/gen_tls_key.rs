//! `rdmablk gen-tls-key`.

use rdmablk::hostid;
use rdmablk::tls_cli::GenTlsKeyArgs;
use std::process::ExitCode;

/// Prints a new configured PSK on stdout, alone, and the identity asked
/// for on stderr.
pub(crate) fn gen_tls_key(g: &GenTlsKeyArgs) -> Result<ExitCode, String> {
    let (key, identity) = g.run(&hostid::default_hostnqn())?;
    println!("{}", key.to_interchange());
    if let Some(identity) = identity {
        eprintln!("identity: {identity}");
    }
    Ok(ExitCode::SUCCESS)
}
