mod common;

mod basic;
mod bombs;
mod cleanup;
mod fs;
mod isolation;
mod limits;
