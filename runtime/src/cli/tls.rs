//! `peerwasm tls init DIR` and `peerwasm tls issue DIR HOST...`: a pool's
//! CA and its workers' certificates (`net::certs`), with the flags to
//! start a worker and a client on them printed after.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use crate::net::certs;

/// What `peerwasm tls` does.
#[derive(clap::Subcommand, Debug)]
pub enum TlsCommand {
    /// Make a pool CA in DIR (ca.crt, and ca.key readable by you alone).
    /// Clients and workers trust ca.crt (--tls-ca); keep ca.key to issue
    /// workers' certificates.
    Init {
        /// Where the CA goes (created 0700 if missing).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Issue a worker a certificate from DIR's CA, for the names and
    /// addresses it is reached at (as clients write them in host:port):
    /// DIR/HOST.crt and DIR/HOST.key.
    Issue {
        /// The directory of `tls init`.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// Host names and IP addresses the worker is reached at.
        #[arg(value_name = "HOST", required = true)]
        hosts: Vec<String>,
        /// The files' name, NAME.crt and NAME.key [default: the first HOST].
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// How many days the certificate is valid.
        #[arg(long, value_name = "N", default_value_t = 365)]
        days: u32,
    },
}

/// Runs `command`, saying what it wrote and how to use it.
pub fn run(command: TlsCommand) -> anyhow::Result<ExitCode> {
    match command {
        TlsCommand::Init { dir } => {
            let ca = certs::init(&dir)?;
            println!(
                "made a pool CA: {} (and {}, yours alone)",
                ca.display(),
                dir.join(certs::CA_KEY).display()
            );
            println!(
                "next, for each worker: peerwasm tls issue {} HOST",
                dir.display()
            );
            println!(
                "clients and workers trust it with --tls-ca {} (or PEERWASM_TLS_CA)",
                ca.display()
            );
        }
        TlsCommand::Issue {
            dir,
            hosts,
            name,
            days,
        } => {
            let now = SystemTime::now();
            // An hour back: a worker whose clock is a little behind the
            // issuer's still takes it at once.
            let from = now - Duration::from_secs(3600);
            let until = now + Duration::from_secs(u64::from(days.max(1)) * 86_400);
            let issued = certs::issue(&dir, &hosts, name.as_deref(), from, until)?;
            println!(
                "issued {} for {} (valid {days} days)",
                issued.cert.display(),
                hosts.join(", ")
            );
            println!(
                "start the worker with: --tls-cert {} --tls-key {} --tls-ca {}",
                issued.cert.display(),
                issued.key.display(),
                dir.join(certs::CA_CERT).display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
