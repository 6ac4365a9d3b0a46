"""The web console's static files (index.html, console.js, console.css), served by the HTTP
listener at / (node/listeners/http.py). No CDN: everything it needs is here."""
