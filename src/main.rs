//! The `kustomize-operator` command: `run`, `render`, `diff`, `plan`, `crd`, `rbac`,
//! `kind pack|unpack`.

use std::process::ExitCode;

use clap::Parser;
use kustomize_operator::cli::{Cli, Command, KindCommand, RunArgs};
use kustomize_operator::diff::Drift;
use kustomize_operator::telemetry::Telemetry;
use kustomize_operator::{Error, Operator};

/// jemalloc, as the binary's allocator. glibc's arenas keep the pages a
/// burst of reconciles filled, pinned by the few small objects still
/// alive on each; jemalloc hands them back. docs/performance.md, "The
/// allocator".
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once when it starts (`_RJEM_MALLOC_CONF` in the
/// environment overrides them): no thread caches, whose objects kept pages
/// of every size class resident; one arena, not four per CPU, so the live
/// objects a burst leaves share slabs instead of half-filling slabs in
/// every arena (1 MiB less idle after 1,000 Samples); freed pages handed
/// back within a second by a background thread. The operator waits on the
/// API server far more than it allocates: a burst costs no more CPU without
/// the caches or with one arena.
#[cfg(feature = "jemalloc")]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 =
    &b"tcache:false,narenas:1,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0];

fn main() -> ExitCode {
    // A render worker (a child of `run`, see `sandbox`) runs no runtime.
    if std::env::args_os().nth(1).as_deref()
        == Some(std::ffi::OsStr::new(
            kustomize_operator::kind::Sandbox::WORKER_ARG,
        ))
    {
        return kustomize_operator::kind::Sandbox::serve_worker();
    }
    let cli = Cli::parse();
    // Outside the runtime: the trace export runs on threads of its own.
    let telemetry = match Telemetry::start(cli.log_format, cli.otlp_endpoint.as_deref()) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(command(cli)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    };
    telemetry.stop();
    code
}

async fn command(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Command::Run(args) => run(*args).await,
        Command::Render(args) => render(&args).await,
        Command::Diff(args) => {
            let source = args.resource.source();
            match kustomize_operator::diff::diff(&source, &args.common, args.kubectl.as_deref())
                .await
            {
                Ok(Ok(Drift::None)) => return ExitCode::SUCCESS,
                Ok(Ok(Drift::Changes)) => return ExitCode::from(1),
                // kubectl said why on stderr.
                Ok(Err(code)) => return ExitCode::from(u8::try_from(code).unwrap_or(2).max(2)),
                Err(e) => {
                    // 1 means "changes": errors exit 2, as kubectl diff's do.
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        Command::Plan(args) => return plan(&args).await,
        Command::Crd(args) => kustomize_operator::manifests::write_crds(&args).map_err(Error::from),
        Command::Rbac(args) => rbac(&args).await,
        Command::Kind(command) => kind(&command),
        Command::Shards(args) => shards(&args).await,
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
        kinds = ?operator.kinds(),
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

async fn render(args: &kustomize_operator::cli::RenderArgs) -> Result<(), Error> {
    let source = args.resource.source();
    let summary = kustomize_operator::render::render(&source, &args.out, &args.common).await?;
    for (verb, dir) in &summary.overlays {
        println!("{verb}: {}", dir.display());
    }
    for object in &summary.deletes {
        println!("delete: {object}");
    }
    for hint in &summary.hints {
        eprintln!("note: {hint}");
    }
    if summary.placeholder_uid {
        eprintln!(
            "note: the resource has no metadata.uid; the templates and the ownership marker saw the stand-in {} (render KIND/NAME, or `kubectl get -o yaml` output, to see the real one)",
            kustomize_operator::kinds::Preview::PLACEHOLDER_UID
        );
    }
    Ok(())
}

/// `plan`: the report on standard output; exit 0 when nothing would
/// fail, 1 when something would, 2 when there is no plan.
async fn plan(args: &kustomize_operator::cli::PlanArgs) -> ExitCode {
    use kustomize_operator::cli::PlanOutput;
    match kustomize_operator::plan::plan(args).await {
        Ok(report) => {
            match args.output {
                PlanOutput::Table => print!("{}", report.table(args.details)),
                PlanOutput::Json => println!("{}", report.json()),
            }
            ExitCode::from(report.exit_code())
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn rbac(args: &kustomize_operator::cli::RbacArgs) -> Result<(), Error> {
    for (_, yaml) in kustomize_operator::manifests::rbac_yaml(args).await? {
        println!("---\n{}", yaml.trim_end());
    }
    Ok(())
}

/// `shards`: the ring of `--auto-shard` as it stands.
async fn shards(args: &kustomize_operator::cli::ShardsArgs) -> Result<(), Error> {
    use kustomize_operator::sharding::report::{self, ShardsError};
    let (_, registry) = args.dirs.load().map_err(ShardsError::from)?;
    let kinds: Vec<_> = registry.all().iter().map(|k| k.api_resource().0).collect();
    // The kinds' resources are what tenants wrote: read through the
    // decoding guard, as `render`, `diff` and `plan` read them.
    let client =
        (kustomize_operator::guard::kubeconfig_client().await).map_err(ShardsError::from)?;
    let report = report::read(client, &args.namespace, &args.ring, &kinds).await?;
    print!("{report}");
    Ok(())
}

/// `kind pack DIR` (to standard output) and `kind unpack FILE`.
fn kind(command: &KindCommand) -> Result<(), Error> {
    use kustomize_operator::kinds::declared::pack;
    match command {
        KindCommand::Pack { dir } => {
            print!("{}", pack::pack(dir)?);
        }
        KindCommand::Unpack { file, out_dir } => {
            let folder = pack::unpack_file(file, out_dir)?;
            eprintln!("wrote {}", folder.display());
        }
    }
    Ok(())
}
