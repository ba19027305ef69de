//! `airlock image`: build, import, pull, list, inspect, remove, save and load images of the
//! local store (crate airlock-oci). Operator commands: nothing here runs on a job's path.

use std::path::PathBuf;
use std::process::ExitCode;

use airlock_engine::LoadedPolicy;
use airlock_oci::{ImageRecord, ImageStore, OciError};
use clap::{Args, Subcommand};

use crate::error_chain;

#[derive(Debug, Args)]
pub struct ImageArgs {
    /// The image store (default: the policy's [images] store, else images/ under the
    /// state directory).
    #[arg(long, global = true, value_name = "DIR")]
    store: Option<PathBuf>,
    /// The policy whose [images] and [docker] sections apply.
    #[arg(long, global = true, value_name = "FILE")]
    policy: Option<PathBuf>,
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build a minimal image from a spec (needs root: debootstrap, chroot).
    Build {
        /// The build spec (TOML; see docs/images.md).
        spec: PathBuf,
        /// Also write the image as an archive (OCI layout + docker save manifest).
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<PathBuf>,
        /// Where debootstrap bases are cached (default: cache/ in the store).
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
    },
    /// Import an OCI layout (directory or tar) or a `docker save` archive.
    Import {
        /// The directory or archive.
        path: PathBuf,
        /// The image's name in the store (and which image of a multi-image archive).
        #[arg(long)]
        name: Option<String>,
    },
    /// Pull an image by digest from a registry (REGISTRY/REPO@sha256:…).
    Pull {
        /// The reference, pinned by digest.
        reference: String,
        /// The image's name in the store.
        #[arg(long)]
        name: Option<String>,
        /// Plain HTTP (a registry on 127.0.0.1 without TLS).
        #[arg(long)]
        plain_http: bool,
    },
    /// List the store's images.
    Ls {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show an image's record (JSON).
    Inspect {
        /// NAME, sha256:… or NAME@sha256:…
        image: String,
    },
    /// Remove an image, its unpacked tree and blobs no other image uses.
    Rm {
        /// NAME, sha256:… or NAME@sha256:…
        image: String,
    },
    /// Write an image as one archive: an OCI layout and a `docker save` archive at once.
    Save {
        /// NAME, sha256:… or NAME@sha256:…
        image: String,
        /// The archive to write.
        #[arg(long, short = 'o', value_name = "FILE")]
        output: PathBuf,
        /// The tag written into it (default: the image's first name).
        #[arg(long)]
        name: Option<String>,
    },
    /// Load an image into Docker or Podman (the same image id there as here).
    Load {
        /// NAME, sha256:… or NAME@sha256:…
        image: String,
        /// docker or podman (their sockets come from the policy's [docker] section).
        #[arg(long, value_name = "BACKEND")]
        backend: String,
        /// The tag it gets there (default: the image's first name).
        #[arg(long)]
        name: Option<String>,
    },
    /// Unpack an image into the read-only rootfs cache now (jobs otherwise do it on first use).
    Prepare {
        /// NAME, sha256:… or NAME@sha256:…
        image: String,
    },
}

pub fn image(args: ImageArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("airlock: {e}");
            ExitCode::from(1)
        }
    }
}

fn oci(e: OciError) -> String {
    error_chain(&e)
}

fn run(args: ImageArgs) -> Result<ExitCode, String> {
    let loaded = match &args.policy {
        Some(path) => LoadedPolicy::from_file(path).map_err(|e| error_chain(&e))?,
        None => LoadedPolicy::builtin(),
    };
    let store_dir = args
        .store
        .clone()
        .unwrap_or_else(|| airlock_oci::store::store_dir(&loaded.policy.images));
    let store = ImageStore::open(&store_dir).map_err(oci)?;
    match args.command {
        ImageCommand::Build {
            spec,
            output,
            cache,
        } => {
            let options = airlock_oci::build::BuildOptions {
                cache_dir: cache.unwrap_or_else(|| store_dir.join("cache")),
                source_date_epoch: std::env::var("SOURCE_DATE_EPOCH")
                    .ok()
                    .and_then(|v| v.parse().ok()),
            };
            let record = airlock_oci::build::build(&store, &spec, &options, &|line| {
                eprintln!("==> {line}");
            })
            .map_err(oci)?;
            if let Some(output) = output {
                save(&store, &record, None, &output)?;
            }
            print_pinned(&record);
        }
        ImageCommand::Import { path, name } => {
            let record =
                airlock_oci::import::import(&store, &path, name.as_deref()).map_err(oci)?;
            print_pinned(&record);
        }
        ImageCommand::Pull {
            reference,
            name,
            plain_http,
        } => {
            let runtime = runtime()?;
            let options = airlock_oci::pull::PullOptions {
                plain_http,
                basic_auth: None,
            };
            let record = runtime
                .block_on(airlock_oci::pull::pull(
                    &store,
                    &reference,
                    name.as_deref(),
                    &options,
                ))
                .map_err(oci)?;
            print_pinned(&record);
        }
        ImageCommand::Ls { json } => {
            let records = store.list().map_err(oci)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&records).map_err(|e| e.to_string())?
                );
            } else {
                println!(
                    "{:<40} {:<19} {:<20} {:>10}  UNPACKED",
                    "NAME", "IMAGE ID", "MADE", "SIZE"
                );
                let now = std::time::SystemTime::now();
                for r in &records {
                    let names = if r.names.is_empty() {
                        vec!["<none>".to_owned()]
                    } else {
                        r.names.clone()
                    };
                    for name in names {
                        println!(
                            "{:<40} {:<19} {:<20} {:>10}  {}",
                            name,
                            format!("sha256:{}", r.id.short()),
                            format!("{} days ago", r.age(now).as_secs() / 86_400),
                            human_bytes(r.layers_size()),
                            if store.rootfs_path(&r.id).is_dir() {
                                "yes"
                            } else if r.build_base_only.is_some() {
                                "base only"
                            } else {
                                "no"
                            }
                        );
                    }
                }
            }
        }
        ImageCommand::Inspect { image } => {
            let record = store.resolve(&image).map_err(oci)?;
            let mut value = serde_json::to_value(&record).map_err(|e| e.to_string())?;
            if let Some(map) = value.as_object_mut() {
                map.insert(
                    "rootfs".into(),
                    serde_json::Value::from(
                        Some(store.rootfs_path(&record.id))
                            .filter(|p| p.is_dir())
                            .map(|p| p.display().to_string()),
                    ),
                );
                map.insert(
                    "made".into(),
                    airlock_oci::store::format_rfc3339(record.made_unix_secs()).into(),
                );
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?
            );
        }
        ImageCommand::Rm { image } => {
            let record = store.remove(&image).map_err(oci)?;
            println!("removed {}", record.id);
        }
        ImageCommand::Save {
            image,
            output,
            name,
        } => {
            let record = store.resolve(&image).map_err(oci)?;
            save(&store, &record, name.as_deref(), &output)?;
            eprintln!("wrote {}", output.display());
        }
        ImageCommand::Load {
            image,
            backend,
            name,
        } => {
            let record = store.resolve(&image).map_err(oci)?;
            load(&store, &record, &backend, name.as_deref(), &loaded)?;
        }
        ImageCommand::Prepare { image } => {
            let record = store.resolve(&image).map_err(oci)?;
            let (path, unpacked) = store.rootfs(&record.id).map_err(oci)?;
            println!(
                "{} {}",
                if unpacked { "unpacked" } else { "ready" },
                path.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("start runtime: {e}"))
}

/// Prints the image id and the rootfs line to pin, on stdout (the id alone on the first
/// line, for scripts).
fn print_pinned(record: &ImageRecord) {
    println!("{}", record.id);
    let name = record.names.first().map_or("image", String::as_str);
    match &record.build_base_only {
        None => eprintln!("pin it: rootfs = \"image:{name}@{}\"", record.id),
        Some(reason) => eprintln!(
            "jobs refuse this image ({reason}); build from it: base = \"image:{name}@{}\"",
            record.id
        ),
    }
}

fn human_bytes(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{:.1}MiB", n as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.1}KiB", n as f64 / 1024.0)
    }
}

fn save(
    store: &ImageStore,
    record: &ImageRecord,
    name: Option<&str>,
    output: &std::path::Path,
) -> Result<(), String> {
    let partial = output.with_extension("partial");
    let file = std::fs::File::create(&partial)
        .map_err(|e| format!("create {}: {e}", partial.display()))?;
    let mut out = std::io::BufWriter::new(file);
    airlock_oci::export::write_archive(store, record, name, &mut out).map_err(oci)?;
    let file = out
        .into_inner()
        .map_err(|e| format!("write {}: {e}", partial.display()))?;
    file.sync_all()
        .map_err(|e| format!("write {}: {e}", partial.display()))?;
    std::fs::rename(&partial, output).map_err(|e| format!("rename to {}: {e}", output.display()))
}

/// Loads the archive through the Engine API and checks the daemon's image id is the
/// store's: Docker and Podman name an image by the sha256 of its config, as airlock does.
fn load(
    store: &ImageStore,
    record: &ImageRecord,
    backend: &str,
    name: Option<&str>,
    loaded: &LoadedPolicy,
) -> Result<(), String> {
    let kind: airlock_core::BackendKind = backend.parse()?;
    let tag = name
        .map(airlock_oci::store::with_tag)
        .or_else(|| record.names.first().cloned())
        .ok_or("the image has no name; give one with --name")?;
    let mut archive = Vec::new();
    airlock_oci::export::write_archive(store, record, Some(&tag), &mut archive).map_err(oci)?;
    let runtime = runtime()?;
    runtime.block_on(async {
        airlock_engine::images::load_into(kind, loaded, archive, &tag, &record.id.to_string())
            .await
            .map_err(|e| e.message)?;
        println!("{}", record.id);
        eprintln!("pin it: rootfs = \"image:{tag}@{}\"", record.id);
        Ok(())
    })
}
