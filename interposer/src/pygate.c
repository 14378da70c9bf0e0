/* The gate in front of every Python-served entry point: the two ways an application's own
 * interpreter can break calls into the embedded Python side.
 *
 * 1. cffi's embedded start-up (Python < 3.12) serializes on a spin lock that waits for
 *    PyCapsule_Type.tp_version_tag to be 0. In a process whose interpreter already ran (torch,
 *    CuPy), one failed attribute look-up on a capsule gives the type a version tag, and the
 *    first driver call then spins forever. Before the first call enters Python we invalidate
 *    the type's method cache (PyType_Modified), which sets the tag back to 0: semantically a
 *    no-op for the type, and what the lock needs.
 * 2. Exit-time teardown (cudart's and cuBLASLt's atexit handlers: primary-context release,
 *    library unload) runs after the application's interpreter has finalized. A call into
 *    Python then crashes the process. Once the interpreter this library ran in is gone (or is
 *    finalizing), teardown entries succeed locally and every other entry answers
 *    CUDA_ERROR_DEINITIALIZED, as a driver shutting down does.
 */
#include <Python.h>
#include <pthread.h>

#include "crane_cuda.h"

#define CUDA_ERROR_DEINITIALIZED 4

int crane_py_prepared;
static int started;  /* the interpreter we call into has been seen running */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

static void prepare(void) {
    if (Py_IsInitialized()) {
        started = 1;
#if PY_VERSION_HEX >= 0x03080000 && PY_VERSION_HEX < 0x030C0000
        if (!finalizing() && PyCapsule_Type.tp_version_tag != 0) {
            PyGILState_STATE g = PyGILState_Ensure();
            PyType_Modified(&PyCapsule_Type);
            PyGILState_Release(g);
        }
#endif
    }
    crane_py_prepared = 1;
}

void crane_py_mark_started(void) { started = 1; }

int crane_py_alive(void) { return Py_IsInitialized() && !finalizing(); }

int crane_py_gate_slow(int teardown) {
    pthread_once(&once, prepare);
    if (Py_IsInitialized() ? !finalizing() : !started) return -1;  /* go ahead */
    return teardown ? CUDA_SUCCESS : CUDA_ERROR_DEINITIALIZED;
}
