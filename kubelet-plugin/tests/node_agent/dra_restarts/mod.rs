//! The kubelet-plugin binary under failure: SIGKILL between prepare and unprepare, a kubelet
//! restart, and claims that are wrong in every way the kubelet can send them.

mod bad_input;
mod outages;
mod restarts;
mod support;
