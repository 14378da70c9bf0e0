/* The gate in front of every Python-served entry point: the ways an application's own
 * interpreter can break calls into the embedded Python side.
 *
 * 1. A library built for another Python version (its Python side compiled against another
 *    version's structures) must not enter the process's interpreter at all: before anything
 *    else, the version the process runs (Py_GetVersion, resolved in the process: the
 *    application's interpreter, or the libpython this library links in a C program) is
 *    compared with the one this library was built for. On a mismatch, one log line says what
 *    to do and every call answers CUDA_ERROR_NOT_INITIALIZED.
 * 2. Start-up (crane_boot.h, written by interposer/build_interposer.py): Crane's paths go in
 *    place and crane/interposer/guest_env.py checks the application's copies of Crane's guest
 *    dependencies and imports the guest side, all before cffi's own start-up, which imports
 *    _cffi_backend before any init code runs and, if its init code fails, lets every call
 *    return 0. A problem found there is logged and answered like a version mismatch. In a C
 *    program the library starts the interpreter itself (as cffi would: Py_InitializeEx(0),
 *    then releasing the GIL), so both cases share this path.
 * 3. cffi's embedded start-up (Python < 3.12) serializes on a spin lock that waits for
 *    PyCapsule_Type.tp_version_tag to be 0. In a process whose interpreter already ran (torch,
 *    CuPy), one failed attribute look-up on a capsule gives the type a version tag, and the
 *    first driver call then spins forever. Before the first call enters cffi we invalidate
 *    the type's method cache (PyType_Modified), which sets the tag back to 0: semantically a
 *    no-op for the type, and what the lock needs.
 * 4. Exit-time teardown (cudart's and cuBLASLt's atexit handlers: primary-context release,
 *    library unload) runs after the application's interpreter has finalized. A call into
 *    Python then crashes the process. Once the interpreter this library ran in is gone (or is
 *    finalizing), teardown entries succeed locally and every other entry answers
 *    CUDA_ERROR_DEINITIALIZED, as a driver shutting down does.
 */
#include <Python.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "crane_boot.h"
#include "crane_cuda.h"

#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4

int crane_py_prepared;
static int started;  /* the interpreter we call into has been seen running */
static int refused;  /* the CUresult every call answers: the guest side could not start */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* Whether the process's interpreter is the version this library was compiled for. Only
 * Py_GetVersion (a plain C string on every version) is called before this is known. */
static int same_version(void) {
    char built[16];
    snprintf(built, sizeof built, "%d.%d", PY_MAJOR_VERSION, PY_MINOR_VERSION);
    const char *running = Py_GetVersion();
    size_t n = strlen(built);
    if (strncmp(running, built, n) == 0 && (running[n] < '0' || running[n] > '9')) return 1;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = '\0';
    size_t vlen = strcspn(running, " ");
    crane_log("this libcuda.so.1 was built for Python %s but the process runs Python %.*s "
              "(%s): Crane's guest side does not start in it and driver calls answer "
              "CUDA_ERROR_NOT_INITIALIZED. Fix: run the program with `crane run`, which "
              "selects a library built for its interpreter, or preload the one "
              "`crane guest-lib --python %s` prints",
              built, (int)vlen, running, exe, exe);
    return 0;
}

/* Runs crane_boot_code with the GIL held; 0 when the guest side is ready. */
static int boot(int owner) {
    PyObject *g = PyDict_New();
    PyObject *self = PyUnicode_DecodeFSDefault(crane_self_path());
    int ok = g && self && PyDict_SetItemString(g, "__builtins__", PyEval_GetBuiltins()) == 0 &&
             PyDict_SetItemString(g, "owner", owner ? Py_True : Py_False) == 0 &&
             PyDict_SetItemString(g, "self_path", self) == 0;
    PyObject *r = ok ? PyRun_String(crane_boot_code, Py_file_input, g, g) : NULL;
    int rc = 0;
    if (r == NULL) {
        crane_log("the guest side's start-up failed (traceback follows); driver calls answer "
                  "CUDA_ERROR_NOT_INITIALIZED");
        PyErr_Print();
        rc = -1;
    } else {
        PyObject *problem = PyDict_GetItemString(g, "problem");  /* borrowed */
        if (problem && problem != Py_None) {
            const char *text = PyUnicode_AsUTF8(problem);
            fprintf(stderr, "%s\n", text ? text : "crane: the guest side cannot start");
            fflush(stderr);
            PyErr_Clear();
            rc = -1;
        }
    }
    Py_XDECREF(r);
    Py_XDECREF(self);
    Py_XDECREF(g);
    return rc;
}

static void prepare(void) {
    if (!same_version()) {
        refused = CUDA_ERROR_NOT_INITIALIZED;
        return;
    }
    int owner = !Py_IsInitialized();
    if (owner) {
        Py_InitializeEx(0);
        PyEval_SaveThread();  /* release the GIL, as cffi's own start-up does */
    }
    if (finalizing()) return;  /* first call during the application's exit: nothing to start */
    started = 1;
    PyGILState_STATE g = PyGILState_Ensure();
    if (boot(owner) != 0) refused = CUDA_ERROR_NOT_INITIALIZED;
#if PY_VERSION_HEX >= 0x03080000 && PY_VERSION_HEX < 0x030C0000
    if (PyCapsule_Type.tp_version_tag != 0) PyType_Modified(&PyCapsule_Type);
#endif
    PyGILState_Release(g);
    if (!refused) crane_py_prepared = 1;
}

void crane_py_mark_started(void) { started = 1; }

int crane_py_alive(void) { return Py_IsInitialized() && !finalizing(); }

int crane_py_gate_slow(int teardown) {
    pthread_once(&once, prepare);
    if (refused) return teardown ? CUDA_SUCCESS : refused;
    if (crane_py_prepared && crane_py_alive()) return -1;  /* go ahead */
    return teardown ? CUDA_SUCCESS : CUDA_ERROR_DEINITIALIZED;
}
