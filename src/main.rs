//! The `kustomize-operator` command: `run`, `render`, `crd`.

use std::process::ExitCode;

use clap::Parser;
use kustomize_operator::cli::{Cli, Command, LogFormat, RunArgs};
use kustomize_operator::kinds::KindOptions;
use kustomize_operator::{Error, Operator, crds_yaml};
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Render(args) => kustomize_operator::render::render_file(
            &args.file,
            &args.out,
            &args.common.kustomize_dir,
            &KindOptions::default(),
        )
        .map(|summary| {
            for (verb, dir) in &summary.overlays {
                println!("{verb}: {}", dir.display());
            }
            for command in &summary.commands {
                println!("run: kubectl {}", command.join(" "));
            }
        })
        .map_err(Error::from),
        Command::Crd(args) => crd(args.out_dir.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: RunArgs) -> Result<(), Error> {
    let operator = Operator::start(&args).await?;
    tracing::info!(
        kinds = ?args.selected_kinds().iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        "operator running"
    );
    let lost = tokio::select! {
        signal = wait_for_signal() => {
            signal?;
            false
        }
        () = operator.lost_leadership() => true,
    };
    tracing::info!(grace = ?args.shutdown_grace, "shutting down: finishing running reconciles");
    if !operator.stop_within(args.shutdown_grace).await {
        tracing::warn!("exiting with reconciles still running");
    }
    if lost {
        return Err(Error::LostLeadership);
    }
    Ok(())
}

async fn wait_for_signal() -> Result<(), Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r.map_err(Error::Signal)?,
    }
    Ok(())
}

fn crd(out_dir: Option<&std::path::Path>) -> Result<(), Error> {
    let crds = crds_yaml()?;
    match out_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| Error::Crd(e.to_string()))?;
            for (name, yaml) in crds {
                let path = dir.join(format!("{name}.yaml"));
                std::fs::write(&path, yaml)
                    .map_err(|e| Error::Crd(format!("{}: {e}", path.display())))?;
            }
        }
        None => {
            for (_, yaml) in crds {
                println!("---\n{}", yaml.trim_end());
            }
        }
    }
    Ok(())
}
