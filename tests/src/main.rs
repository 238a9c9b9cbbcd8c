//! The `peerwasm` command, built in this package so that its tests can
//! run it (see Cargo.toml): the same one line as runtime/src/main.rs.

fn main() -> std::process::ExitCode {
    peerwasm::cli::main()
}
