//! The `ctrl` binary: serve a node, make certificates, and operate the
//! cluster (deploy, get, list, stop, watch).

#![forbid(unsafe_code)]

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    cli::init_tracing(args.verbose, cli::log_format(&args));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            match e.downcast_ref::<cli::Exit>() {
                Some(exit) => std::process::ExitCode::from(exit.code),
                None => std::process::ExitCode::FAILURE,
            }
        }
    }
}
