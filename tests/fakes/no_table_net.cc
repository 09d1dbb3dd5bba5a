// A library that exports ncclNet symbols of versions the loader does not take (v6, v13) and none
// it does: loading it must fail with a message naming what it has.
namespace {
struct NotATable {
    const char* name;
};
}  // namespace

extern "C" __attribute__((visibility("default"))) const NotATable ncclNetPlugin_v6 = {"old"};
extern "C" __attribute__((visibility("default"))) const NotATable ncclNetPlugin_v13 = {"future"};
