package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// OwnTLS starts a fresh server of the binary that listens for TLS only, on
// 127.0.0.1, with a certificate authority and a server certificate (for the
// IP 127.0.0.1) generated for it; Server.TLS trusts that authority. It
// skips on VALKEY_ADDR, and is stopped at the end of the test.
func OwnTLS(tb testing.TB) *Server {
	tb.Helper()
	if os.Getenv("VALKEY_ADDR") != "" || os.Getenv("VALKEY_IMAGE") != "" {
		tb.Skip("starts a TLS server of its own from a server binary; skipped on VALKEY_ADDR and VALKEY_IMAGE")
	}
	bin := Binary()
	if bin == "" {
		SkipOrFail(tb, Help)
	}
	srv, err := start(bin, nil, nil, writeTLSFiles)
	if err != nil {
		tb.Fatalf("TLS server: %v", err)
	}
	tb.Cleanup(srv.Stop)
	tally(tb, "ran")
	return srv
}

// writeTLSFiles writes a new CA and a server certificate for 127.0.0.1
// into dir, and returns a client configuration that trusts the CA and the
// server's TLS arguments (clients are not asked for certificates).
func writeTLSFiles(dir string) (*tls.Config, []string, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "admit test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	files := map[string]*pem.Block{
		"ca.crt":     {Type: "CERTIFICATE", Bytes: caDER},
		"server.crt": {Type: "CERTIFICATE", Bytes: der},
		"server.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(b), 0o600); err != nil {
			return nil, nil, err
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	args := []string{
		"--tls-cert-file", filepath.Join(dir, "server.crt"), "--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"), "--tls-auth-clients", "no",
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, args, nil
}
