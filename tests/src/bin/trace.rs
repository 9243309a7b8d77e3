//! Writes or checks the cache's cross-host trace,
//! `tests/trace/cache-trace.json` (see `stile_tests::trace`).
//!
//! ```text
//! cargo run --release -p stile-tests --bin trace -- write   # record it from the native core and write it
//! cargo run --release -p stile-tests --bin trace -- check   # exit 1 if the checked-in file is stale
//! cargo run --release -p stile-tests --bin trace -- print   # record it and print it to stdout
//! ```

use std::process::ExitCode;

use stile_tests::trace;

fn main() -> ExitCode {
    let command = std::env::args().nth(1).unwrap_or_default();
    let fresh = trace::to_json(&trace::record());
    let path = trace::path();
    match command.as_str() {
        "write" => {
            if let Err(error) = std::fs::create_dir_all(path.parent().expect("the trace has a directory"))
                .and_then(|()| std::fs::write(&path, &fresh))
            {
                eprintln!("cannot write {}: {error}", path.display());
                return ExitCode::FAILURE;
            }
            println!("wrote {} ({} bytes)", path.display(), fresh.len());
            ExitCode::SUCCESS
        }
        "check" => {
            let checked_in = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(error) => {
                    eprintln!("cannot read {}: {error}\nrun `{}`", path.display(), trace::REGENERATE);
                    return ExitCode::FAILURE;
                }
            };
            match trace::staleness(&checked_in, &fresh) {
                None => {
                    println!("{} is current", path.display());
                    ExitCode::SUCCESS
                }
                Some(difference) => {
                    eprintln!("{} is stale ({difference})\nrun `{}`", path.display(), trace::REGENERATE);
                    ExitCode::FAILURE
                }
            }
        }
        "print" => {
            print!("{fresh}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: trace write|check|print");
            ExitCode::from(2)
        }
    }
}
