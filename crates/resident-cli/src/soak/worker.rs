//! `resident bench soak-worker`: one worker process of the soak, serving the keyed kernel's
//! partitions over JetStream until told to stop or killed.

use super::*;

/// The hidden worker: serves the soak's keyed kernel until SIGTERM/SIGINT.
pub fn worker(o: WorkerOptions) -> std::process::ExitCode {
    #[cfg(unix)]
    sig::die_with_parent();
    match worker_inner(o) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak worker: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

pub(super) fn worker_inner(o: WorkerOptions) -> Result<(), SoakError> {
    let rt = Arc::new(Runtime::builder().backend(Backend::Cpu).build()?);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io("tokio runtime"))?;
    let mut opts = keyed_options(o.partitions);
    let k = o.workers.max(1);
    opts.preferred = Some((0..o.partitions).filter(|p| p % k == o.slot).collect());
    opts.max_partitions = o.partitions.div_ceil(k.saturating_sub(1).max(1)) as usize;
    opts.owner = format!("slot{}-pid{}", o.slot, std::process::id());
    let stats = Arc::new(KeyedStats::default());
    tokio.block_on(async {
        let client = tokio::time::timeout(
            Duration::from_secs(10),
            connect_options().connect(o.url.clone()),
        )
        .await
        .map_err(|_| SoakError::Timeout("connect within 10 s".into()))?
        .map_err(|e| SoakError::Io {
            what: "connect".into(),
            source: std::io::Error::other(e),
        })?;
        let writer = {
            let (stats, path) = (stats.clone(), o.stats.clone());
            tokio::spawn(async move {
                loop {
                    let text = serde_json::to_string(&*stats).unwrap_or_default();
                    let tmp = path.with_extension("tmp");
                    if std::fs::write(&tmp, text).is_ok() {
                        let _ = std::fs::rename(&tmp, &path);
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            })
        };
        let kernels = rt.clone();
        let launch =
            Arc::new(move |id: &str, states: Vec<FoldState>| fold::launch(&kernels, id, states));
        let shutdown = async {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{signal, SignalKind};
                match (
                    signal(SignalKind::terminate()),
                    signal(SignalKind::interrupt()),
                ) {
                    (Ok(mut t), Ok(mut i)) => {
                        tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
                    }
                    _ => std::future::pending::<()>().await,
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
        };
        let r = serve_keyed_jetstream(
            client,
            launch,
            Arc::new(PodCodec),
            FoldState::default(),
            opts,
            stats.clone(),
            shutdown,
        )
        .await;
        writer.abort();
        let text = serde_json::to_string(&*stats).unwrap_or_default();
        let _ = std::fs::write(&o.stats, text);
        r.map_err(SoakError::from)
    })
}

// ---------------------------------------------------------------- the fault schedule
