//! Hostile: exits with code 3 through `proc_exit`.
fn main() {
    println!("exiting with 3");
    std::process::exit(3);
}
