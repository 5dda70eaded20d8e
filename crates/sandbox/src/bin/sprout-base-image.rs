//! `sprout-base-image [PATH [SUITE [MIRROR]]]`: build the machine-wide sandbox base image
//! (or reuse a finished one), as `sprout worker init` does, from a binary that needs only
//! this crate, so that scripts/setup.sh can start debootstrap while the rest of the
//! workspace still compiles. Without arguments: the defaults of `[base]`.

use std::process::ExitCode;

use sprout_sandbox::base::{self, Outcome};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() > 3 || args.iter().any(|a| a.starts_with('-')) {
        eprintln!("usage: sprout-base-image [PATH [SUITE [MIRROR]]] (defaults: {} {})", base::DEFAULT_PATH, base::DEFAULT_SUITE);
        return ExitCode::from(2);
    }
    let path = std::path::PathBuf::from(args.first().map_or(base::DEFAULT_PATH, String::as_str));
    let suite = args.get(1).map_or(base::DEFAULT_SUITE, String::as_str);
    let mut say = |line: &str| eprintln!("{line}");
    match base::ensure(&path, suite, args.get(2).map(String::as_str), &mut say) {
        Ok(Outcome::Reused) => eprintln!("base image ready (reused): {}", path.display()),
        Ok(Outcome::Built(took)) => eprintln!("base image built in {:.0} s: {}", took.as_secs_f64(), path.display()),
        Err(e) => {
            eprintln!("sprout-base-image: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
