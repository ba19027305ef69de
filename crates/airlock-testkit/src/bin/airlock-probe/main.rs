//! `airlock-probe`: run inside a sandbox by end-to-end tests, it prints one JSON object (an
//! `airlock_testkit::ProbeReport`) describing what the job can see and do, and exits 0 even
//! when what it finds is bad: the tests judge, the probe only reports.
//!
//! ```text
//! airlock-probe report [--canary HOST:PORT] [--fill-tmp] [--pretty]
//! ```
//!
//! It is harmless outside a sandbox, even as root: dangerous syscalls use arguments the
//! kernel rejects (or run in a throwaway child, see `airlock_sys::probe`), every file it
//! creates is removed again, and `--fill-tmp` stops at a cap.

#![forbid(unsafe_code)]

mod checks;

use std::io::Write;
use std::process::ExitCode;

use airlock_testkit::{ProbeReport, REPORT_VERSION};

const USAGE: &str = "usage: airlock-probe report [--canary HOST:PORT] [--fill-tmp] [--pretty]";

/// What the command line asked for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Options {
    canary: Option<String>,
    fill_tmp: bool,
    pretty: bool,
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let (command, rest) = args
        .split_first()
        .ok_or_else(|| "missing command".to_owned())?;
    if command != "report" {
        return Err(format!("unknown command {command:?}"));
    }
    let mut options = Options::default();
    let mut rest = rest.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--canary" => {
                let target = rest
                    .next()
                    .ok_or_else(|| "--canary needs HOST:PORT".to_owned())?;
                options.canary = Some(target.clone());
            }
            "--fill-tmp" => options.fill_tmp = true,
            "--pretty" => options.pretty = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(options)
}

fn collect(options: &Options) -> ProbeReport {
    let mut notes = Vec::new();
    if let Err(errno) = airlock_sys::probe::ignore_sigxfsz() {
        notes.push(format!("could not ignore SIGXFSZ: {errno}"));
    }
    let pid = rustix::process::getpid().as_raw_pid();
    let identity = checks::identity();
    let status = checks::proc_status(&mut notes);
    let mounts = checks::mounts(&mut notes);
    let writes = checks::writes(pid, &mut notes);
    let tmp_exec = checks::tmp_exec(pid, &mut notes);
    let network = checks::network(options.canary.as_deref());
    let paths = checks::paths(&mut notes);
    let env = checks::env();
    let syscalls = checks::syscalls();
    let rlimits = checks::rlimits();
    // Last, so the other /tmp checks run with space left.
    let fill_tmp = options.fill_tmp.then(|| checks::fill_tmp(pid, &mut notes));
    ProbeReport {
        version: REPORT_VERSION,
        identity,
        status,
        mounts,
        writes,
        tmp_exec,
        fill_tmp,
        network,
        paths,
        env,
        syscalls,
        rlimits,
        notes,
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse_args(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("airlock-probe: {message}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let report = collect(&options);
    let json = if options.pretty {
        serde_json::to_string_pretty(&report)
    } else {
        serde_json::to_string(&report)
    };
    let written = json.map_err(std::io::Error::other).and_then(|json| {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{json}")?;
        stdout.flush()
    });
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("airlock-probe: writing the report: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn parses_report_options() {
        assert_eq!(parse_args(&args(&["report"])), Ok(Options::default()));
        assert_eq!(
            parse_args(&args(&["report", "--fill-tmp", "--canary", "10.0.0.1:80"])),
            Ok(Options {
                canary: Some("10.0.0.1:80".to_owned()),
                fill_tmp: true,
                pretty: false,
            })
        );
    }

    #[test]
    fn rejects_bad_command_lines() {
        assert!(parse_args(&args(&[])).is_err());
        assert!(parse_args(&args(&["scan"])).is_err());
        assert!(parse_args(&args(&["report", "--canary"])).is_err());
        assert!(parse_args(&args(&["report", "--bogus"])).is_err());
    }
}
