//! Reads milliseconds from stdin and sleeps that long (wall time, not CPU).
fn main() {
    let ms = peerwasm_guest_examples::stdin_number();
    std::thread::sleep(std::time::Duration::from_millis(ms));
    println!("slept {ms} ms");
}
