fn main() -> std::process::ExitCode {
    peerwasm::cli::main()
}
