//! Copies every file of the preopened `/in` to `/out`, upper-cased.
use std::fs;

fn main() {
    let entries = match fs::read_dir("/in") {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot read /in: {e} (grant it with --dir HOST::/in)");
            std::process::exit(1);
        }
    };
    let mut copied = 0;
    for entry in entries {
        let entry = entry.expect("reading /in");
        if !entry.file_type().expect("file type").is_file() {
            continue;
        }
        let content = fs::read(entry.path()).expect("reading a file of /in");
        let upper = match String::from_utf8(content) {
            Ok(text) => text.to_uppercase().into_bytes(),
            Err(e) => e.into_bytes().to_ascii_uppercase(),
        };
        let target = std::path::Path::new("/out").join(entry.file_name());
        if let Err(e) = fs::write(&target, upper) {
            eprintln!("error: cannot write {}: {e}", target.display());
            std::process::exit(1);
        }
        copied += 1;
    }
    println!("copied {copied} files");
}
