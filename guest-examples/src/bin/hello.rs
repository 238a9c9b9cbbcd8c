//! Prints its arguments, one per line, then `$GREETING` if it is set.
fn main() {
    for arg in std::env::args().skip(1) {
        println!("{arg}");
    }
    if let Ok(greeting) = std::env::var("GREETING") {
        println!("{greeting}");
    }
}
