// fivebeans over TLS (tests/tls/test_tls.py): the library opens its socket
// with net.createConnection(port, host); here that call gets a socket of
// Node's tls module instead, verified against the test CA. Then use, put,
// reserve, delete. Prints one JSON line: what the library saw.
//   NODE_PATH=.../fivebeans/node_modules node fivebeans_tls.js PORT CA_FILE
'use strict';
const fs = require('fs');
const net = require('net');
const tls = require('tls');

const port = Number(process.argv[2]);
const ca = fs.readFileSync(process.argv[3]);
net.createConnection = (p, host) => tls.connect({port: p, host, ca, servername: 'localhost'});

const fivebeans = require('fivebeans');
const client = new fivebeans.client('127.0.0.1', port);
const fail = (what, err) => { console.error(what + ': ' + err); process.exit(1); };
setTimeout(() => fail('timeout', 'no result within 30 s'), 30000).unref();

client.on('error', (err) => fail('connection', err));
client.on('connect', () => {
  client.use('fivebeans-tls', (err) => {
    if (err) return fail('use', err);
    client.put(0, 0, 60, 'hello over tls', (err, putId) => {
      if (err) return fail('put', err);
      client.watch('fivebeans-tls', (err) => {
        if (err) return fail('watch', err);
        client.reserve_with_timeout(5, (err, id, payload) => {
          if (err) return fail('reserve', err);
          client.destroy(id, (err) => {
            if (err) return fail('delete', err);
            console.log(JSON.stringify({put: String(putId), reserved: String(id), payload: payload.toString(),
                                        deleted: true, tls: client.stream instanceof tls.TLSSocket}));
            client.end();
            process.exit(0);
          });
        });
      });
    });
  });
});
client.connect();
