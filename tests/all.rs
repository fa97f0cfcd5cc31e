//! One integration-test binary (it links once and shares helpers): every suite drives the
//! real `codecage` binary as root and checks the host afterwards.

mod suite;
