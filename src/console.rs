//! The web console's files (`console/`), compiled into the binary and handed to the core as
//! its static table while `a2a.console.enabled`: nothing is read from disk at run time.

use agentd_core::statics::StaticFile;

/// Every file the console serves, by its path under `/console/`.
pub static FILES: [StaticFile; 3] = [
    StaticFile {
        path: "/console/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../console/index.html"),
    },
    StaticFile {
        path: "/console/console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../console/console.js"),
    },
    StaticFile {
        path: "/console/console.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../console/console.css"),
    },
];
