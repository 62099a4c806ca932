fn main() {
    // `sqlx::migrate!` embeds the migrations: rebuild when they change.
    println!("cargo:rerun-if-changed=../migrations");
}
