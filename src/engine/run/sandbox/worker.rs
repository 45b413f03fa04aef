//! The render worker: a child process of the operator (the same binary,
//! started as `kustomize-operator __render-worker`) that parses template
//! sets and renders them, one request at a time, under the limits its
//! parent set ([`super::process`]). A template that loops, recurses or
//! grows without end costs this process, which its parent kills and
//! replaces; never the operator.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::process::ExitCode;

use super::protocol::{Request, Response, read_frame, write_frame};
use crate::engine::model::templates::Templates;

/// The argument that makes the binary a render worker.
pub const WORKER_ARG: &str = "__render-worker";

/// The most template sets a worker keeps parsed; past it, it forgets them
/// all (the operator loads again what it asks for).
const SETS_KEPT: usize = 64;

/// Serves requests from standard input until it closes, or until the
/// operator that started it is gone (a render looping then would never
/// read the closed input).
pub fn serve() -> ExitCode {
    watch_parent();
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut output = BufWriter::new(std::io::stdout().lock());
    let mut sets: HashMap<u64, Templates> = HashMap::new();
    loop {
        let request = match read_frame::<Request>(&mut input) {
            Ok(Some(request)) => request,
            Ok(None) => return ExitCode::SUCCESS,
            Err(_) => return ExitCode::FAILURE,
        };
        let response = answer(&mut sets, request);
        if write_frame(&mut output, &response).is_err() {
            return ExitCode::FAILURE;
        }
    }
}

/// Exits the process once its parent is gone (it is then another
/// process's child), looking every second.
fn watch_parent() {
    let parent = std::os::unix::process::parent_id();
    let watcher = std::thread::Builder::new()
        .name("parent".into())
        .spawn(move || {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                if std::os::unix::process::parent_id() != parent {
                    std::process::exit(1);
                }
            }
        });
    if watcher.is_err() {
        std::process::exit(1);
    }
}

fn answer(sets: &mut HashMap<u64, Templates>, request: Request) -> Response {
    match request {
        Request::Load(set) => {
            let id = set.id;
            match set.compile() {
                Ok(templates) => {
                    if sets.len() >= SETS_KEPT {
                        sets.clear();
                    }
                    sets.insert(id, templates);
                    Response::Loaded
                }
                Err(e) => Response::Failed(e.to_string()),
            }
        }
        Request::Render { id, name, context } => match sets.get(&id) {
            None => Response::UnknownSet,
            Some(templates) => match templates.render_json(&name, &context) {
                Ok(text) => Response::Rendered(text),
                Err(e) => Response::Failed(e.to_string()),
            },
        },
    }
}
