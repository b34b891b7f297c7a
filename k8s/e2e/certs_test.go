package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's throwaway CA, the apiserver's serving certificate and the service-account key pair.
type pki struct {
	CA, ServerCert, ServerKey, SAKey, SAPub string
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

func newPKI(dir string) (pki, error) {
	p := pki{CA: filepath.Join(dir, "ca.crt"), ServerCert: filepath.Join(dir, "apiserver.crt"),
		ServerKey: filepath.Join(dir, "apiserver.key"), SAKey: filepath.Join(dir, "sa.key"), SAPub: filepath.Join(dir, "sa.pub")}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "detshare-e2e-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return p, err
	}
	if err := writePEM(p.CA, "CERTIFICATE", caDER); err != nil {
		return p, err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	srv := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return p, err
	}
	if err := writePEM(p.ServerCert, "CERTIFICATE", srvDER); err != nil {
		return p, err
	}
	k, _ := x509.MarshalECPrivateKey(srvKey)
	if err := writePEM(p.ServerKey, "EC PRIVATE KEY", k); err != nil {
		return p, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return p, err
	}
	k, _ = x509.MarshalECPrivateKey(saKey)
	if err := writePEM(p.SAKey, "EC PRIVATE KEY", k); err != nil {
		return p, err
	}
	pub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	return p, writePEM(p.SAPub, "PUBLIC KEY", pub)
}
