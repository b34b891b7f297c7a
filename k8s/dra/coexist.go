package dra

import (
	"context"
	"fmt"
	"strings"

	"github.com/sirupsen/logrus"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/detshare/detshare/k8s/deviceplugin"
)

// NVIDIADriver is NVIDIA's DRA driver (k8s-dra-driver-gpu), whose ResourceSlices name each GPU by its UUID (device
// attribute uuid).
const NVIDIADriver = "gpu.nvidia.com"

// OtherDrivers tells, for each GPU of inv, which devices of NVIDIA's DRA driver on this node carry its UUID
// ("<slice>/<device>"), from slices (the node's ResourceSlices of that driver).
func OtherDrivers(inv deviceplugin.Inventory, slices []*resourceapi.ResourceSlice) map[int][]string {
	var out map[int][]string
	for _, g := range inv.GPUs {
		for _, s := range slices {
			if s.Spec.Driver != NVIDIADriver {
				continue
			}
			for _, d := range s.Spec.Devices {
				for _, key := range []resourceapi.QualifiedName{"uuid", NVIDIADriver + "/uuid"} {
					if v := d.Attributes[key].StringValue; v != nil && g.UUID != "" && strings.EqualFold(*v, g.UUID) {
						if out == nil {
							out = map[int][]string{}
						}
						out[g.Index] = append(out[g.Index], s.Name+"/"+d.Name)
					}
				}
			}
		}
	}
	return out
}

// OtherDriverHealth watches this node's ResourceSlices of NVIDIA's DRA driver (a watch with field selectors
// spec.driver and spec.nodeName, under the list and watch the plugin's role grants on resourceslices) and reports
// each GPU of inv one of them publishes as deviceplugin.ReasonClaimedElsewhere: Slices leaves it out until that
// slice goes. Each change is logged, naming the GPU and NVIDIA's devices.
func OtherDriverHealth(ctx context.Context, client kubernetes.Interface, node string, inv deviceplugin.Inventory) (deviceplugin.Health, error) {
	sel := fields.AndSelectors(fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, NVIDIADriver),
		fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node)).String()
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sel }))
	inf := factory.Resource().V1().ResourceSlices().Informer()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("watch the ResourceSlices of %s on node %s: cache not synced", NVIDIADriver, node)
	}
	report := deviceplugin.ClaimReport(inv, func(g deviceplugin.GPU, devs []string) {
		logrus.WithFields(logrus.Fields{"gpu": g.Index, "uuid": g.UUID, "driver": NVIDIADriver, "devices": devs}).Error(
			"NVIDIA's DRA driver publishes this GPU: DetShare does not publish it until that ResourceSlice goes; " +
				"give the GPU to one driver (docs/kubernetes.md \"Coexistence\")")
	}, func(g deviceplugin.GPU) {
		logrus.WithFields(logrus.Fields{"gpu": g.Index, "uuid": g.UUID}).Info("NVIDIA's DRA driver publishes this GPU no more: DetShare publishes it again")
	})
	return func() map[int]string {
		var list []*resourceapi.ResourceSlice
		for _, o := range inf.GetStore().List() {
			if s, ok := o.(*resourceapi.ResourceSlice); ok {
				list = append(list, s)
			}
		}
		return report(OtherDrivers(inv, list))
	}, nil
}
